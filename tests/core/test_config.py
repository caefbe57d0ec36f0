"""The job file: one frozen tree; every mistake names its dotted key."""

import dataclasses

import pytest

from prism.core.config import job_from_dict, job_to_dict, load_job
from prism.core.errors import ConfigError
from prism.core.ranks import format_rank_ranges, parse_rank_ranges
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.timeout(30)

BASE = {"name": "j", "entrypoint": "-m mypkg.train", "world_size": 8}


def load(**overrides):
    return job_from_dict({**BASE, **overrides})


def test_defaults_and_frozen():
    job = load()
    assert (job.world_size, job.slots, job.device, job.iterations.warmup, job.iterations.measured) == (8, 1, "cpu", 1, 3)
    assert job.is_module and job.module == "mypkg.train"
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.world_size = 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"slotz": 2}, "slotz: unknown key"),
        ({"iterations": {"warmup": 1, "measurd": 2}}, "iterations.measurd: unknown key"),
        ({"iterations": {"warmup": "1"}}, "iterations.warmup: expected an integer, got '1'"),
        ({"world_size": True}, "world_size: expected an integer, got True"),
        ({"world_size": 0}, "world_size: must be > 0, got 0"),
        ({"device": "tpu"}, "device: must be 'cpu' or 'cuda', got 'tpu'"),
        ({"args": "--steps 3"}, "args: expected a list of strings, got a string"),
        ({"args": ["--steps", 3]}, "args[1]: expected a string, got 3"),
        ({"env": {"A": [1]}}, "env.A: expected a scalar, got list"),
        ({"parallelism": {"dp": 2, "tp": 2, "pp": 3}}, "parallelism: dp*tp*pp*cp = 2*2*3*1 = 12 but world_size is 8"),
        ({"parallelism": {"dp": 4, "tp": 2, "ep": 3}}, "parallelism.ep: ep=3 must divide dp*tp=8"),
        ({"parallelism": [2, 2]}, "parallelism: expected a mapping, got list"),
        ({"entrypoint": "-m"}, "entrypoint: must be a script path or '-m package.module'"),
    ],
)
def test_mistakes_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load(**overrides)
    assert message in str(info.value)


def test_required_key_missing():
    with pytest.raises(ConfigError, match="world_size: required key is missing"):
        job_from_dict({"name": "j", "entrypoint": "-m x"})


def test_load_job_names_the_file_and_resolves_the_script(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text("name: j\nentrypoint: train.py\nworld_size: 2\n")
    job = load_job(tmp_path / "job.yaml")
    assert job.script_path == (tmp_path / "train.py").resolve()
    (tmp_path / "bad.yaml").write_text("name: j\nentrypoint: train.py\nworld_size: [2\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_job(tmp_path / "bad.yaml")
    (tmp_path / "miss.yaml").write_text("name: j\nentrypoint: gone.py\nworld_size: 2\n")
    with pytest.raises(ConfigError, match=r"miss.yaml: entrypoint: script not found: .*gone.py"):
        load_job(tmp_path / "miss.yaml")


def test_round_trip_through_dict():
    job = load(args=["--steps", "3"], env={"X": 1}, parallelism={"dp": 4, "tp": 2})
    again = job_from_dict(job_to_dict(job))
    assert again == dataclasses.replace(job, base_dir=again.base_dir)


# Examples whose job files are not W=8: the pipeline without an optimizer, and RankLens' two-rank
# anomaly and overlap examples (docs/replay.md).
SMALL_EXAMPLES = {"pp_sleep_noopt": 4, "anomaly": 2, "overlap": 2}


def test_every_bundled_example_job_loads():
    files = sorted(EXAMPLES.glob("*/job*.yaml"))
    assert len(files) >= 7
    for f in files:
        job = load_job(f)
        assert job.world_size == SMALL_EXAMPLES.get(f.parent.name, 8), f


def test_iterations_boundary_round_trips(tmp_path):
    (tmp_path / "train.py").write_text("def step():\n    pass\n")
    job = job_from_dict({"name": "j", "entrypoint": "train.py", "world_size": 2,
                         "iterations": {"boundary": "step"}}, base_dir=tmp_path)
    assert job.iterations.boundary == "step"
    assert job_to_dict(job)["iterations"]["boundary"] == "step"
    assert "boundary" not in job_to_dict(dataclasses.replace(job, iterations=dataclasses.replace(
        job.iterations, boundary="")))["iterations"]
    assert job_from_dict(job_to_dict(job), base_dir=tmp_path) == job


def test_rank_ranges():
    assert parse_rank_ranges("0-3,8, 12-13") == (0, 1, 2, 3, 8, 12, 13)
    assert format_rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    with pytest.raises(ValueError, match="outside 0-7"):
        parse_rank_ranges("6-9", world_size=8)
    with pytest.raises(ValueError, match="'3-1': end 1 is before start 3"):
        parse_rank_ranges("3-1")
    with pytest.raises(ValueError, match="'x' in 'x' is not N or N-M"):
        parse_rank_ranges("x")
