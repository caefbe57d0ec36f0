"""Timing that the context switch could not give: slice planning, merging slice measurements
onto the bare graph, and inter-slice calibration (DESIGN §7)."""

from .calibrate import CalibrationReport, RankCalibration, calibrate
from .merge import (
    DEFAULT_MERGE,
    MERGES,
    apply_measurements,
    median_of_takes,
    merge_slice,
    merge_takes,
    rotated_takes,
    segments,
    settle_warmup,
    typical_steps,
    typical_takes,
)
from .slices import crowded_slices, plan_slices, representatives

__all__ = [
    "DEFAULT_MERGE",
    "MERGES",
    "CalibrationReport",
    "RankCalibration",
    "apply_measurements",
    "calibrate",
    "crowded_slices",
    "median_of_takes",
    "merge_slice",
    "merge_takes",
    "plan_slices",
    "representatives",
    "rotated_takes",
    "segments",
    "settle_warmup",
    "typical_steps",
    "typical_takes",
]
