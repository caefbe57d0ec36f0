"""``prism replay``: logical rank R of a recorded job, alone in one process, under the ``recorded``
engine (RankLens §III). The script runs its own compute; every comm op gets the recorded (or
estimated) completion time and, with ``values``, the recorded outputs (docs/replay.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

from prism.core.errors import PrismError
from prism.core.isolation import isolated_run
from prism.core.rundir import RunDir
from prism.graph.io import read_graph, verify_graph
from prism.graph.records import NodeKind, RankRecord

from .engines.recorded import TIMINGS, ReplayOptions, record_payload_dir
from .launch import LaunchOptions, launch_ranks

__all__ = ["ReplayError", "ReplayResult", "replay_rank", "DEBUGPY_PORT", "TIMINGS"]

log = logging.getLogger(__name__)

DEBUGPY_PORT = 5678


class ReplayError(PrismError):
    """A replay that cannot start: no such rank, no graph, no debugger."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    rank: int
    record: RankRecord
    recorded_step_times_ns: tuple[int, ...]
    warmup_steps: int
    recorded_compute_ns: tuple[int, ...] = ()
    """The script's own time (compute spans) per recorded step: the part of a step a host's load
    changes between recording and replay."""

    @property
    def step_times_ns(self) -> tuple[int, ...]:
        return self.record.summary.step_times_ns

    def mean_step_ns(self, times: tuple[int, ...]) -> float:
        """Mean over the steps after the job's warmup steps that both runs have."""
        n = min(len(self.step_times_ns), len(self.recorded_step_times_ns))
        window = times[min(self.warmup_steps, max(0, n - 1)):n]
        return statistics.fmean(window) if window else float("nan")

    @property
    def replayed_mean_ns(self) -> float:
        return self.mean_step_ns(self.step_times_ns)

    @property
    def recorded_mean_ns(self) -> float:
        return self.mean_step_ns(self.recorded_step_times_ns)

    @property
    def error(self) -> float:
        """Relative error of the replayed mean iteration time against the recorded one."""
        return self.replayed_mean_ns / self.recorded_mean_ns - 1.0

    @property
    def compute_adjusted_error(self) -> float:
        """The error with the script's own compute drift taken out (replayed minus recorded compute
        time in the compared steps): what the replayed completion times contribute, apart from a
        host that runs the script's compute slower or faster than when it was recorded."""
        n = min(len(self.step_times_ns), len(self.recorded_step_times_ns), len(self.recorded_compute_ns))
        lo = min(self.warmup_steps, max(0, n - 1))
        replayed = _compute_per_step(self.record.nodes)
        drift = sum(replayed.get(k, 0) - self.recorded_compute_ns[k] for k in range(lo, n))
        return (sum(self.step_times_ns[lo:n]) - drift) / sum(self.recorded_step_times_ns[lo:n]) - 1.0


def _compute_per_step(nodes) -> dict[int, int]:
    out: dict[int, int] = {}
    for n in nodes:
        if n.kind is NodeKind.COMPUTE and n.duration_ns > 0:
            out[n.step] = out.get(n.step, 0) + n.duration_ns
    return out


def replay_rank(run_dir: str | Path, rank: int, *, values: bool = False, timing: str = "recorded",
                steps: int = 0, graph: str = "real", withhold: float = 0.0, seed: int = 0,
                debug_port: int = 0, timeout_s: float = 600.0,
                script_args: tuple[str, ...] | None = None) -> ReplayResult:
    """Replay logical rank ``rank`` of the run in ``run_dir``; ``steps`` > 0 stops it after that
    many steps; ``debug_port`` > 0 opens a debugpy listener in the rank's process and waits for
    a client before the script starts; ``script_args`` replace the recorded job's arguments (a
    changed schedule or size: ops that no longer align get estimated durations)."""
    run = RunDir(Path(run_dir))
    job = run.load_job()
    if script_args is not None:
        job = dataclasses.replace(job, args=tuple(script_args))
    if not 0 <= rank < job.world_size:
        raise ReplayError(f"--rank {rank} is outside the recorded job's ranks 0-{job.world_size - 1}")
    if timing not in TIMINGS:
        raise ReplayError(f"--timing {timing!r}: expected one of {', '.join(TIMINGS)}")
    if not 0.0 <= withhold < 1.0:
        raise ReplayError(f"--withhold {withhold}: expected a fraction in [0, 1)")
    graph_dir = run.graph_dir(graph)
    if not (graph_dir / "manifest.pb").is_file():
        raise ReplayError(f"{graph_dir}: no graph to replay (run `prism record --job ... --out {run.root}`"
                          f"{' --payloads' if values else ''} first)")
    verify_graph(graph_dir)
    if values and not (record_payload_dir(run.root, rank) / "index.json").is_file() and not (
            run.payloads / "index.json").is_file():
        raise ReplayError(f"{run.root}: --values needs the tensors rank {rank} received: record the job with "
                          f"`prism record --payloads` (or collect it with `prism collect`)")
    options = ReplayOptions(run_dir=str(run.root), rank=rank, graph=graph, values=values, timing=timing,
                            withhold=withhold, seed=seed)
    engine_options = options.to_engine_options()
    if steps > 0:
        engine_options["max_steps"] = str(steps)
    if debug_port:
        if importlib.util.find_spec("debugpy") is None:
            raise ReplayError("--debug needs debugpy in the environment that runs the script "
                              "(`pip install debugpy`), or run the rank under gdb/pdb as docs/replay.md says")
        engine_options["debugpy"] = f"127.0.0.1:{debug_port}"
        timeout_s = max(timeout_s, 24 * 3600.0)  # a person is stepping through it
    # The script runs in a copy of its folder, as in every other phase (prism.core.isolation): what
    # the recorded run wrote (checkpoints) does not send the replay down another path.
    with isolated_run(job, run.root, f"replay/rank-{rank}") as workspace:
        (record,) = launch_ranks(job, LaunchOptions(engine="recorded", ranks=(rank,), timeout_s=timeout_s,
                                                    log_dir=str(run.root / "replays" / f"rank-{rank}" / "logs"),
                                                    engine_options=engine_options, workspace=workspace))
    recorded_graph = read_graph(graph_dir)
    recorded = recorded_graph.summaries.get(rank)
    compute = _compute_per_step(recorded_graph.nodes.get(rank, ()))
    steps_recorded = len(recorded.step_times_ns) if recorded else 0
    return ReplayResult(rank=rank, record=record,
                        recorded_step_times_ns=recorded.step_times_ns if recorded else (),
                        warmup_steps=job.iterations.warmup,
                        recorded_compute_ns=tuple(compute.get(k, 0) for k in range(steps_recorded)))
