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

from dataclasses import dataclass
from pathlib import Path

import yaml

from .atomic import atomic_write_text
from .config import JobConfig, job_from_dict, job_to_dict
from .errors import RunDirError

__all__ = ["RunDir"]


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
        data = job_to_dict(job)
        if not job.is_module:
            data["entrypoint"] = str(job.script_path)
        data["env"] = dict(job.env)
        header = f"# frozen copy of the job (base_dir: {job.base_dir})\n"
        atomic_write_text(self.job_file, header + yaml.safe_dump(data, sort_keys=False))

    def load_job(self) -> JobConfig:
        if not self.job_file.is_file():
            raise RunDirError(f"{self.root}: not a run directory (no job.yaml)")
        data = yaml.safe_load(self.job_file.read_text())
        return job_from_dict(data, base_dir=self.root, source=str(self.job_file))
