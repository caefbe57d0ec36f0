"""Timing that the context switch could not give: slice planning, merging slice measurements
onto the bare graph, and inter-slice calibration (DESIGN §7)."""

from .calibrate import CalibrationReport, RankCalibration, calibrate
from .merge import apply_measurements, segments
from .slices import plan_slices, representatives

__all__ = [
    "CalibrationReport",
    "RankCalibration",
    "apply_measurements",
    "calibrate",
    "plan_slices",
    "representatives",
    "segments",
]
