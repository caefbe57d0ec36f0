"""A pair of sandbox ranks with no vrank beside them (a group of two, all sandbox) runs its ops on a
real gloo group on the host path, as the device paths do for every group of sandbox ranks: the
job's own op on the job's own links, not prism's ring steps in Python, whose per-step cost a
calibration slice would otherwise measure as the pair's transfer (session 28: tp-sleep's timed
graph held 6.0 ms of comm per step against 2.3 ms real). Two operands reduce to the same bits in
either order, so the values stay the capture's."""

import json

import pytest

from prism.vrank_replayer import EmulateOptions, emulate

pytestmark = pytest.mark.timeout(600)

SANDBOX = (2, 3)
"""examples/tp at W=8 is dp 4 × tp 2: {2, 3} is a tp group; its dp groups have vranks."""


def test_a_tp_pair_runs_on_gloo_and_keeps_the_captured_values(captured_example):
    run, real, capture = captured_example("tp", SANDBOX)
    result = emulate(run, EmulateOptions(ranks=SANDBOX, timeout_s=300, device_path="host"))
    for r in SANDBOX:
        got = result.ranks[r]
        comm = real.comm_nodes(r)
        pair_ops = [n for n in comm if set(real.groups[n.group_id].ranks) == set(SANDBOX)]
        assert len(pair_ops) >= 4 * len(real.summaries[r].losses)  # tp's all-reduces, and its set-up
        # Only the ops of groups with vranks went through prism's pruned path.
        assert got.num_ops == len(comm) - len(pair_ops)
        assert got.diverged_ops == ()
        captured = json.loads((capture / "workers" / f"rank-{r:05d}.live.json").read_text())["losses"]
        assert captured and [repr(x) for x in got.losses] == [repr(x) for x in captured]
    (rep,) = result.replayers
    assert rep.num_ops == sum(got.num_ops for got in result.ranks.values())
