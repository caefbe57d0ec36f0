"""The job-file keys of prism collect: values and comm_inputs."""

import pytest

from prism.core.config import job_from_dict
from prism.core.errors import ConfigError
from tests.conftest import ASSETS

pytestmark = pytest.mark.timeout(30)

BASE = {"name": "x", "entrypoint": "train.py", "world_size": 4}
DIR = ASSETS / "jobs/collect_ops4"


def test_defaults_record_small_values_by_context_switching():
    job = job_from_dict(BASE, base_dir=DIR)
    assert (job.values.record, job.values.small_max_bytes, job.values.ranks) == ("small", 65536, "")
    assert job.comm_inputs.source == "context_switch"


@pytest.mark.parametrize(("extra", "message"), [
    ({"values": {"ranks": "2-9"}}, "values.ranks: ranks 4-9 are outside 0-3"),
    ({"values": {"record": "all"}}, "values.record: must be 'small' or 'none'"),
    ({"values": {"small_max_bytes": -1}}, "values.small_max_bytes: must be >= 0"),
    ({"comm_inputs": {"source": "magic"}}, "comm_inputs.source: must be 'context_switch', 'recorded' or 'rules'"),
    ({"comm_inputs": {"filler": "random"}}, "comm_inputs.filler: must be one of mirror, zeros, ones"),
    ({"comm_inputs": {"control_flow": "always"}}, "comm_inputs.control_flow: must be 'exact' or 'filler'"),
    ({"templates": "tp"}, "templates: must be 'none' or 'dp'"),
    ({"templates": "dp"}, "templates: 'dp' needs parallelism.dp > 1"),
    ({"templates": "dp", "parallelism": {"dp": 2, "tp": 2}, "values": {"ranks": "0"}},
     "values.ranks: full values are not collected with templates: dp"),
    ({"parallelism": {"dp": 2, "tp": 2, "mesh": ["dp", "tp"]}}, "parallelism.mesh: must order all of pp, dp, cp, tp"),
    ({"parallelism": {"dp": 2, "tp": 2, "mesh": ["dp", "tp", "pp", "ep"]}}, "parallelism.mesh: must order all of"),
    ({"comm_inputs": {"source": "recorded"}}, "comm_inputs.run: comm_inputs.source 'recorded' needs"),
    ({"values": {"rank": "1"}}, "values.rank: unknown key"),
])
def test_bad_keys_are_named(extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        job_from_dict({**BASE, **extra}, base_dir=DIR)


def test_templates_and_mesh_order_load_and_freeze_back(tmp_path):
    from prism.core.config import job_to_dict

    data = {**BASE, "templates": "dp", "parallelism": {"dp": 2, "tp": 2, "mesh": ["pp", "dp", "cp", "tp"]}}
    job = job_from_dict(data, base_dir=DIR)
    assert job.templates == "dp" and job.parallelism.mesh == ("pp", "dp", "cp", "tp")
    assert job_from_dict(job_to_dict(job), base_dir=DIR) == job


@pytest.mark.timeout(120)
def test_more_slots_than_ranks_collects_on_as_many_slots_as_ranks(tmp_path):
    from prism.coordinator import CollectOptions, collect_job
    from prism.core.config import load_job

    job = load_job(DIR / "job.yaml")
    result = collect_job(job, tmp_path / "run", CollectOptions(slots=job.world_size + 3, timeout_s=100))
    assert result.num_slots == job.world_size and result.graph.meta["slots"] == str(job.world_size)
    assert result.max_active <= job.world_size
