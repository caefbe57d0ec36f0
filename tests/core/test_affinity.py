"""PRISM_CPU_AFFINITY=rank: one thread of each physical core first, rank r on the r-th CPU of that
order, the same in every process that runs rank r."""

import os
import subprocess
import sys

import pytest

from prism.core.affinity import AffinityError, cpu_order, pin_rank

pytestmark = pytest.mark.timeout(60)


def _sysfs(tmp_path, cores: dict[int, int]):
    for cpu, core in cores.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    return tmp_path


def test_one_thread_of_every_core_comes_before_any_second_thread(tmp_path):
    # Linux numbers siblings either far apart (0 and 2 share a core) or side by side (0 and 1).
    assert cpu_order(range(4), _sysfs(tmp_path / "far", {0: 0, 1: 1, 2: 0, 3: 1})) == [0, 1, 2, 3]
    assert cpu_order(range(4), _sysfs(tmp_path / "near", {0: 0, 1: 0, 2: 1, 3: 1})) == [0, 2, 1, 3]
    # Only the CPUs the process may use, and CPUs without topology are cores of their own.
    assert cpu_order([1, 3], _sysfs(tmp_path / "near2", {0: 0, 1: 0, 2: 1, 3: 1})) == [1, 3]
    assert cpu_order([5, 4], tmp_path / "none") == [4, 5]


def test_a_rank_is_pinned_to_its_cpu_in_a_process_of_its_own():
    order = cpu_order(os.sched_getaffinity(0))
    code = ("import os; from prism.core.affinity import pin_rank; "
            "cpu = pin_rank(3); print(cpu, sorted(os.sched_getaffinity(0)))")
    env = {**os.environ, "PRISM_CPU_AFFINITY": "rank"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50, check=True)
    want = order[3 % len(order)]
    assert out.stdout.split(None, 1) == [str(want), f"[{want}]\n"]


def test_no_setting_pins_nothing_and_an_unknown_one_names_the_variable():
    before = os.sched_getaffinity(0)
    assert pin_rank(0, "none") is None and pin_rank(0, "") is None
    assert os.sched_getaffinity(0) == before
    with pytest.raises(AffinityError, match="PRISM_CPU_AFFINITY='cores'"):
        pin_rank(0, "cores")


PINNED_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(2):
    dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"{dist.get_rank()}.json"), "w") as f:
    json.dump(sorted(os.sched_getaffinity(0)), f)
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_the_job_files_env_pins_every_rank_of_a_real_run(tmp_path):
    import json

    import yaml

    from prism.core.config import load_job
    from prism.sandbox.recording import record_job

    (tmp_path / "train.py").write_text(PINNED_SCRIPT)
    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "pinned", "entrypoint": "train.py", "args": [str(seen)], "world_size": 2,
        "env": {"PRISM_CPU_AFFINITY": "rank", "PRISM_MEMORY": "rss"}, "iterations": {"warmup": 0, "measured": 1}}))
    record_job(load_job(tmp_path / "job.yaml"), tmp_path / "run", timeout_s=60)
    order = cpu_order(os.sched_getaffinity(0))
    assert {r: json.loads((seen / f"{r}.json").read_text()) for r in range(2)} == \
        {r: [order[r % len(order)]] for r in range(2)}
