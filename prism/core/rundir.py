"""The run directory: everything one job produces (DESIGN §1).

```
RUN/job.yaml            frozen copy of the job
RUN/graph/real/         recorded from a real run (prism record)
RUN/graph/bare/         collected (prism collect)
RUN/graph/timed/        calibrated (prism calibrate)
RUN/payloads/           recorded comm tensors
RUN/emulations/<id>/    emulation outputs
RUN/logs/               per-rank logs of the last launch
```
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from .atomic import atomic_write_text
from .config import JobConfig, job_from_dict, job_to_dict
from .errors import RunDirError

__all__ = ["RunDir", "PROGRAM_KEYS"]

FROZEN_HEADER = "# frozen copy of the job"
PROGRAM_KEYS = ("entrypoint", "args", "env", "world_size", "device", "moe_router")
"""The keys of a frozen job that decide what its ranks do; the others (iterations, slots, templates,
memory cap, ...) are how prism runs or reads it, and may differ between the commands of one run."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        # Absolute: workers run in the script's directory, and paths handed to them must hold there.
        object.__setattr__(self, "root", Path(self.root).resolve())

    @property
    def job_file(self) -> Path:
        return self.root / "job.yaml"

    def graph_dir(self, kind: str) -> Path:
        return self.root / "graph" / kind

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def payloads(self) -> Path:
        return self.root / "payloads"

    def save_job(self, job: JobConfig) -> None:
        """Freeze the job; a relative entrypoint is stored as an absolute path."""
        header = f"{FROZEN_HEADER} (base_dir: {job.base_dir})\n"
        atomic_write_text(self.job_file, header + yaml.safe_dump(_frozen(job), sort_keys=False))

    def claim(self, job: JobConfig, *, replace: bool = False,
              remedy: str = "Pass --force to replace that run, or choose another --out") -> None:
        """Check that RUN may hold ``job`` before a command writes a recording or a collection into it.

        A run directory of the same program (``PROGRAM_KEYS`` equal) is kept: its collected and
        calibrated graphs still describe the job. One of another program is refused, because its
        graphs, captures and payloads would sit beside a recording they do not match; with
        ``replace`` its contents are removed first. A job.yaml that prism did not write (a user's
        job file) is never overwritten."""
        if not self.job_file.is_file():
            return
        text = self.job_file.read_text()
        if not text.startswith(FROZEN_HEADER):
            raise RunDirError(f"{self.job_file}: not a run's frozen job (a job file?); prism would overwrite it. "
                              "Choose another --out")
        old = yaml.safe_load(text) or {}
        new = yaml.safe_load(yaml.safe_dump(_frozen(job)))  # the types a read gives (lists, not tuples)
        changed = [k for k in PROGRAM_KEYS if old.get(k) != new.get(k)]
        if not changed:
            return
        if not replace:
            key = changed[0]
            raise RunDirError(f"{self.root} holds a run of another program ({key}: {old.get(key)!r} there, "
                              f"{new.get(key)!r} now); its collected and calibrated data would not match. "
                              f"{remedy}")
        log.warning("%s: replacing the run of another program (%s changed)", self.root, ", ".join(changed))
        for entry in self.root.iterdir():
            if entry != self.job_file:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        self.job_file.unlink()  # last: a removal cut short still names the run it belonged to

    def load_job(self) -> JobConfig:
        if not self.job_file.is_file():
            raise RunDirError(f"{self.root}: not a run directory (no job.yaml)")
        data = yaml.safe_load(self.job_file.read_text())
        return job_from_dict(data, base_dir=self.root, source=str(self.job_file))


def _frozen(job: JobConfig) -> dict:
    data = job_to_dict(job)
    if not job.is_module:
        data["entrypoint"] = str(job.script_path)
    data["env"] = dict(job.env)
    return data
