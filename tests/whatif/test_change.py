"""What a what-if changes on the sandbox ranks (``prism emulate --env/--args/--entrypoint``)."""

import pytest

from prism.core.config import load_job
from prism.core.errors import ConfigError
from prism.core.whatif import SandboxChange, parse_env_items
from tests.conftest import ASSETS

JOB = ASSETS / "jobs/whatif_pipe/job.yaml"


def test_env_items_parse_in_order_and_a_later_key_wins():
    assert parse_env_items(["A=1", "B=x=y", "A=2", "C="]) == (("A", "2"), ("B", "x=y"), ("C", ""))
    for bad in ("A", "=1", "A B=1"):
        with pytest.raises(ConfigError, match=r"^--env: "):
            parse_env_items([bad])


def test_the_change_applies_to_the_job_the_sandbox_ranks_run(tmp_path):
    job = load_job(JOB)
    assert SandboxChange().apply(job) is job and SandboxChange().is_empty
    script = tmp_path / "other.py"
    script.write_text("print('changed')\n")
    change = SandboxChange(env=(("PIPE_STAGE_SCALE", "1:0.5"),), args=("--steps", "2"), entrypoint=str(script))
    changed = change.apply(job)
    assert changed.env == {"PIPE_STAGE_SCALE": "1:0.5"} and changed.args == ("--steps", "2")
    assert changed.script_path == script.resolve() and changed.world_size == job.world_size
    assert change.describe() == {"env": {"PIPE_STAGE_SCALE": "1:0.5"}, "args": ["--steps", "2"],
                                 "entrypoint": str(script)}
    with pytest.raises(ConfigError, match=r"^--entrypoint: .*missing\.py: no such file"):
        SandboxChange(entrypoint=str(tmp_path / "missing.py")).apply(job)
