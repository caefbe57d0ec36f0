"""Chrome trace export: one process per rank, compute on tid 0, one comm lane per group."""

import json

import pytest

from prism.graph.export import to_chrome_trace
from prism.graph.simulate import simulate
from prism.graph.text import parse_graph

pytestmark = pytest.mark.timeout(30)

GRAPH = """
group 0 ranks=0,1 desc=dp
r0#0 COMP t=0+100
r0#1 COLL all_reduce g0:0 16B f32[4] sum t=100+50
r0#2 MARK step_end t=150
r1#0 COMP t=0+140
r1#1 COLL all_reduce g0:0 16B f32[4] sum t=140+10
r1#2 MARK step_end t=150
"""


def test_recorded_times_become_complete_events_on_lanes():
    trace = to_chrome_trace(parse_graph(GRAPH))
    spans = [(e["pid"], e["tid"], e["name"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans == [
        (0, 0, "compute", 0.0, 0.1), (0, 1, "all_reduce", 0.1, 0.05),
        (1, 0, "compute", 0.0, 0.14), (1, 1, "all_reduce", 0.14, 0.01),
    ]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names[(0, 1)] == "comm g0 dp"
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert [(m["pid"], m["name"], m["ts"]) for m in marks] == [(0, "step_end", 0.15), (1, "step_end", 0.15)]


def test_simulated_times_replace_recorded_ones():
    graph = parse_graph(GRAPH)
    trace = to_chrome_trace(graph, simulate(graph))
    ar = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "all_reduce"]
    # The all-reduce starts when the later rank issues it (140 ns) and takes the shorter observed
    # duration (10 ns) on both ranks.
    assert [(e["pid"], e["ts"], e["dur"]) for e in ar] == [(0, 0.14, 0.01), (1, 0.14, 0.01)]


def check_nesting(trace: dict) -> int:
    """Slices on one (pid, tid) nest or follow each other; returns how many were checked."""
    by_lane: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            by_lane.setdefault((e["pid"], e["tid"]), []).append((start, start + round(e["dur"] * 1000)))
    for lane, spans in by_lane.items():
        stack: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"slice [{start}, {end}] crosses its parent on {lane}"
            stack.append(end)
    return sum(len(s) for s in by_lane.values())


def test_async_comm_on_one_stream_gets_nested_slices_and_flow_arrows():
    # two async all-reduces issued back to back overlap from issue to completion; on their lane the
    # second starts when the first ends. A send/recv pair gets a flow arrow.
    graph = parse_graph("""
    group 0 ranks=0,1 desc=dp
    r0#0 COMP t=0+100
    r0#1 COLL all_reduce g0:0 16B f32[4] sum async t=100+80
    r0#2 COLL all_reduce g0:1 16B f32[4] sum async t=101+120
    r0#3 SEND g0:0 ->1 16B f32[4] t=102+5
    r0#4 WAIT #1 t=107+73
    r0#5 WAIT #2 t=180+41
    r1#0 COMP t=0+100
    r1#1 COLL all_reduce g0:0 16B f32[4] sum async t=100+80
    r1#2 COLL all_reduce g0:1 16B f32[4] sum async t=101+120
    r1#3 RECV g0:0 <-0 16B f32[4] t=102+6
    r1#4 WAIT #1 t=108+72
    r1#5 WAIT #2 t=180+41
    """)
    trace = json.loads(json.dumps(to_chrome_trace(graph)))  # valid JSON both ways
    assert check_nesting(trace) == 12
    ars = [(e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0 and e["name"] == "all_reduce"]
    assert ars == [(0.1, 0.08), (0.18, 0.041)]
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 0}
    assert lanes == {"compute", "comm g0 dp", "comm g0 send→r1 dp"}
    flows = [(e["ph"], e["pid"], e["cat"]) for e in trace["traceEvents"] if e["ph"] in "stf"]
    assert flows.count(("s", 0, "p2p")) == 1 and flows.count(("f", 1, "p2p")) == 1
    assert sorted(f for f in flows if f[2] == "collective") == [("f", 1, "collective")] * 2 + [("s", 0, "collective")] * 2
    slices = {(e["pid"], e["tid"], e["ts"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    for f in (e for e in trace["traceEvents"] if e["ph"] in "stf"):
        assert (f["pid"], f["tid"], f["ts"]) in slices  # every arrow binds to a slice's start


def test_injected_jobs_export_nested_slices_on_every_lane():
    from prism.analysis.inject import cases

    for case in list(cases())[::4]:
        assert check_nesting(json.loads(json.dumps(to_chrome_trace(case.graph)))) > 0, case.name
