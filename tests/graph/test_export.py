"""Chrome trace export: one process per rank, compute on tid 0, one comm lane per group."""

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
