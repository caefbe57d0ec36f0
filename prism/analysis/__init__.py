"""Step-time gap analysis (GapScope): a feasible lower bound per step from measured work and the
parallelism's dependency rules, the gap split into recoverable and hard classes, the binding
chain, and Gantt charts of a step per rank and lane."""

from .gaps import (
    CLASS_NAMES,
    CLASSES,
    RECOVERABLE,
    GapReport,
    Link,
    StepGap,
    analyze_graph,
    gradient_groups,
    structural_peers,
)
from .model import Variant, build_step_model, measure_work

__all__ = [
    "CLASSES",
    "CLASS_NAMES",
    "RECOVERABLE",
    "GapReport",
    "Link",
    "StepGap",
    "analyze_graph",
    "gradient_groups",
    "structural_peers",
    "Variant",
    "build_step_model",
    "measure_work",
]
