"""End to end on CPU: the hybrid example (pp2 x dp2 x tp2, W=8) with ranks 2 and 5 real and the six
others virtual (one replayer) reproduces, bit for bit, every comm tensor (FSDP's parameter
all-gathers and gradient reduce-scatters, TP all-reduces, pipeline messages) and every loss of
ranks 2 and 5 in the capture run (all 8 ranks, prism's ring order: the values a collection
produces), and the real gloo run's losses within rounding."""

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from prism.core.errors import IntegrityError, RankFailedError
from prism.nccl_patches.recorded_store import recorded_dir
from prism.vrank_replayer import EmulateOptions, emulate

pytestmark = pytest.mark.timeout(900)

SANDBOX = (2, 5)


@pytest.fixture(scope="module")
def hybrid_run(captured_example):
    """A run directory with the real graph of hybrid and the recorded data of ranks {2, 5},
    derived from a capture run."""
    return captured_example("hybrid", SANDBOX)


def _bits(t):
    return t.contiguous().view(torch.uint8) if t.numel() else t


def test_ranks_2_and_5_reproduce_the_capture_run_bitwise(hybrid_run, tmp_path):
    run, real, capture = hybrid_run
    # The host data path (the sandbox runs the pruned ring against the replayer's transports);
    # tests/vrank/test_lanes_path.py runs hybrid on the delegated one.
    result = emulate(run, EmulateOptions(ranks=SANDBOX, capture_dir=str(tmp_path / "emu"), timeout_s=300,
                                         device_path="host"))
    assert set(result.ranks) == set(SANDBOX)
    for r in SANDBOX:
        got = result.ranks[r]
        assert got.num_ops == len(real.comm_nodes(r))
        assert got.diverged_ops == ()
        # Every transport connected when the script created its group (as ProcessGroupGloo does),
        # none inside a measured op.
        assert got.num_transports == 3 and got.lazy_transports == ()
        want = load_file(str(capture / f"rank-{r:05d}.safetensors"))
        mine = load_file(str(tmp_path / "emu" / f"rank-{r:05d}.safetensors"))
        assert mine.keys() == want.keys()
        assert [k for k in want if not torch.equal(_bits(mine[k]), _bits(want[k]))] == []
        # the loss: bitwise vs the capture run, within rounding vs the real gloo run
        import json

        captured = json.loads((capture / "workers" / f"rank-{r:05d}.live.json").read_text())["losses"]
        assert [repr(x) for x in got.losses] == [repr(x) for x in captured]
        for a, b in zip(got.losses, real.summaries[r].losses, strict=True):
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5 * abs(b)
    assert not math.isnan(result.ranks[5].losses[-1])  # rank 5 holds the last stage's loss
    (rep,) = result.replayers
    # transports: one per group of a sandbox rank that has vranks and communicates (tp, dp, pp of
    # each); the 8-rank default group never communicates, so it is never connected
    assert rep.num_transports == 6
    assert rep.num_ops == sum(len(real.comm_nodes(r)) for r in SANDBOX)


def test_missing_recorded_data_stops_the_emulation_with_the_op_named(hybrid_run, tmp_path):
    run, _, _ = hybrid_run
    broken = tmp_path / "recorded"
    shutil.copytree(recorded_dir(run, SANDBOX), broken)
    victim = broken / "c" / "5" / "3.0.safetensors"  # dp group of rank 2, 4th all-gather
    victim.unlink()
    with pytest.raises(IntegrityError) as e:
        emulate(run, EmulateOptions(ranks=SANDBOX, recorded_dir=str(broken), timeout_s=120))
    # The record is listed in index.json, so its absence is damage: the file and the op's key are
    # named, before any process starts (recorded_store.check_files).
    assert f"{victim}: recorded data of c/5/3/0 is missing (listed in index.json)" in str(e.value)


def test_a_flipped_byte_in_recorded_data_stops_the_emulation_naming_the_file(hybrid_run, tmp_path):
    # The record's sha256 (in its metadata) is checked when it is first loaded: the emulation
    # stops instead of running on a wrong value.
    run, _, _ = hybrid_run
    broken = tmp_path / "recorded"
    shutil.copytree(recorded_dir(run, SANDBOX), broken)
    victim = broken / "c" / "5" / "3.0.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01  # the last byte is tensor data
    victim.write_bytes(bytes(data))
    with pytest.raises(RankFailedError) as e:
        emulate(run, EmulateOptions(ranks=SANDBOX, recorded_dir=str(broken), timeout_s=120))
    assert f"{victim}: sha256 mismatch in the recorded data of c/5/3/0" in e.value.traceback_text
