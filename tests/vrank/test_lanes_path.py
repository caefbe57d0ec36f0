"""The GPU data path's protocol, on CPU: with ``device_path="lanes"`` every op a sandbox rank has
with vranks is delegated over one ordered lane to the replayer (inputs out, outputs back, the
pruned collective run in the replayer), as the ``nccl`` path does between a sandbox GPU and an
assistant GPU. The emulated ranks' losses equal the collected run's bitwise, op counts match, and
sandbox-only traffic goes nowhere else."""

import math

import pytest

from prism.core.errors import PrismError
from prism.core.layout import device_layout
from prism.vrank_replayer import EmulateOptions, emulate

# These tests compare values: one tracked emulation, not a timed one plus a memory pass (which
# tests/emulate/test_validate_cli.py and test_isolation.py run).
ONE_PASS = "inline"


def _collect_then_emulate_on_lanes(example: str, sandbox: tuple[int, ...], collected_with_values, timeout_s: float):
    """``example`` collected with values for ``sandbox`` (the session's collection), those ranks
    emulated on the lanes path; every op of theirs ran, none diverged."""
    run, collected = collected_with_values(example, sandbox)
    result = emulate(run, EmulateOptions(ranks=sandbox, timeout_s=timeout_s, device_path="lanes", memory=ONE_PASS))
    for r in sandbox:
        assert result.ranks[r].num_ops == len(collected.comm_nodes(r))
        assert result.ranks[r].diverged_ops == ()
    return collected, result


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_delegated_lanes_reproduce_the_collected_values_bitwise(collected_with_values):
    # hybrid: FSDP2 all-gathers/reduce-scatters, TP all-reduces, pipeline sends/recvs with vrank
    # neighbours (rank 5 is on the last stage, the only one with a loss).
    sandbox = (2, 5)
    collected, result = _collect_then_emulate_on_lanes("hybrid", sandbox, collected_with_values, timeout_s=300)
    assert result.extra["layout"] == "cpu"
    for r in sandbox:
        got, want = result.ranks[r].losses, collected.summaries[r].losses
        assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got, want, strict=True)), (r, got, want)
    assert not math.isnan(result.ranks[5].losses[0]), "the last stage has a loss"
    assert result.replayers[0].num_ops > 0
    # Every input was the recorded one: the replayer answered collectives with the recorded
    # outputs instead of running the ring, and the losses above are still bitwise.
    assert result.replayers[0].num_recorded_outputs > 0
    # Every group of hybrid (dp, tp, pp) has two members: a ring of two is no longer than the
    # lane's own round trip, so no output was held for the group's transfer (tests/vrank/test_transfer_hold.py).
    assert result.replayers[0].num_transfer_holds == 0


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_messages_between_two_sandbox_stages_of_a_group_with_vranks(collected_with_values):
    # examples/pp, 1F1B, pp 4 x dp 2 (rank = stage * 2 + replica): ranks 0 and 2 are stages 0 and
    # 1 of replica 0, both real. Their activations and gradients go between them, not to the
    # replayer (which serves lanes only), on a group that also has vranks; before the fix the
    # emulation hung until its timeout.
    collected, _ = _collect_then_emulate_on_lanes("pp", (0, 2), collected_with_values, timeout_s=150)
    peers = {n.peer for n in collected.comm_nodes(0) if n.peer >= 0}
    assert 2 in peers, "the test needs a message between the two sandbox ranks"


def test_default_layouts_on_one_two_and_eight_gpus():
    one = device_layout("cuda", 1, (0,), 1)  # a sandbox rank and its replayer share the GPU
    assert one.path == "ipc" and one.rank_gpu == {0: 0} and one.replayer_gpu == (0,)
    assert device_layout("cuda", 1, (0, 1), 1).path == "host"  # NCCL refuses two sandbox ranks on one GPU
    two = device_layout("cuda", 2, (0,), 1)
    assert two.path == "nccl" and two.rank_gpu == {0: 0} and two.replayer_gpu == (1,)
    eight = device_layout("cuda", 8, (2, 5), 2)
    assert eight.path == "nccl" and eight.rank_gpu == {2: 0, 5: 1} and eight.replayer_gpu == (6, 7)
    shared = device_layout("cuda", 2, (0, 1), 1)  # two sandbox ranks and a replayer on two GPUs
    assert shared.path == "ipc" and shared.rank_gpu == {0: 0, 1: 1} and shared.replayer_gpu == (1,)
    assert device_layout("cuda", 2, (0, 1), 1, path="host").path == "host"
    assert device_layout("cuda", 2, (0, 1), 1, sandbox_gpus=(0,)).path == "host"
    assert device_layout("cpu", 0, (0,), 1).path == "host"
    assert device_layout("cpu", 0, (0,), 1, path="lanes").path == "lanes"


def test_layout_errors_name_the_gpus():
    with pytest.raises(PrismError, match="assistant GPUs: \\[3\\] outside 0-1"):
        device_layout("cuda", 2, (0,), 1, assistant_gpus=(3,))
    with pytest.raises(PrismError, match="NCCL refuses two ranks on one GPU"):
        device_layout("cuda", 1, (0,), 1, path="nccl")
    with pytest.raises(PrismError, match="device: cpu"):
        device_layout("cpu", 0, (0,), 1, path="nccl")
    with pytest.raises(PrismError, match="device path ipc needs a GPU per sandbox rank"):
        device_layout("cuda", 1, (0, 1), 1, path="ipc")
