"""PrismTrace: the execution graph (records), its text and on-disk forms, checks, and passes.

Records are immutable; passes (validate, simulate, to_networkx) are pure functions of a Graph.
This package never imports grpc; its generated protobuf code lives in ``prism.graph._pb``.
"""

from __future__ import annotations

from prism.graph.io import SCHEMA_VERSION, read_graph, write_graph
from prism.graph.nxview import instance_id, to_networkx
from prism.graph.records import COMM_KINDS, CommOp, Graph, GroupInfo, Node, NodeKind, RankSummary, TemplateMap
from prism.graph.simulate import (
    RankTimeline,
    SimResult,
    StepRow,
    compare_steps,
    estimate_transfers,
    simulate,
    timed_graph,
)
from prism.graph.steps import Period, find_period, infer_step_marks, no_steps_message
from prism.graph.templates import build_template_map, dp_permutations, expand
from prism.graph.text import format_graph, format_node, parse_graph, parse_node
from prism.graph.validate import Violation, check, validate

__all__ = [
    # records
    "NodeKind",
    "CommOp",
    "Node",
    "GroupInfo",
    "RankSummary",
    "Graph",
    "COMM_KINDS",
    "TemplateMap",
    # DP templates
    "dp_permutations",
    "build_template_map",
    "expand",
    # text form
    "format_node",
    "parse_node",
    "format_graph",
    "parse_graph",
    # on disk
    "SCHEMA_VERSION",
    "write_graph",
    "read_graph",
    # checks
    "Violation",
    "validate",
    "check",
    # networkx view
    "to_networkx",
    "instance_id",
    # simulation
    "simulate",
    "SimResult",
    "RankTimeline",
    "StepRow",
    "compare_steps",
    "estimate_transfers",
    "timed_graph",
    # iteration boundaries of ranks that marked none
    "Period",
    "find_period",
    "infer_step_marks",
    "no_steps_message",
]
