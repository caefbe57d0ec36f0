"""``iterations.boundary``: the job file says where a step ends, for scripts that step no optimizer."""

from __future__ import annotations

import textwrap

import pytest

from prism.core.config import job_from_dict
from prism.core.errors import ConfigError
from prism.sandbox.recording import walk_rank

pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent("""\
    import time
    import torch.distributed as dist
    import helper


    def train_step(i):
        \"\"\"One step: a sleep and no comm op, so no period could tell the steps.\"\"\"
        time.sleep(0.01)
        return i


    def main():
        dist.init_process_group("gloo")
        for i in range(5):
            train_step(i)
            helper.after_step()
            time.sleep(0.005)  # line 17
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")
HELPER = "def after_step():\n    pass\n"


def _job(tmp_path, boundary: str | None, script: str = SCRIPT):
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "helper.py").write_text(HELPER)
    data = {"name": "b", "entrypoint": "train.py", "world_size": 2}
    if boundary is not None:
        data["iterations"] = {"boundary": boundary}
    return job_from_dict(data, base_dir=tmp_path)


@pytest.mark.parametrize("boundary", ["train_step", "train:train_step", "__main__:train_step", "helper:after_step",
                                      "train.py:17"])
def test_each_form_ends_one_step_per_iteration(tmp_path, boundary):
    record = walk_rank(_job(tmp_path, boundary), 0, engine="fake", timeout_s=240)
    steps = record.summary.step_times_ns
    assert len(steps) == 5
    assert all(s >= 10_000_000 for s in steps[1:])  # each holds at least one 10 ms sleep
    marks = [n for n in record.nodes if n.kind.value == "MARK"]
    assert len(marks) == 5


def test_a_boundary_replaces_optimizer_steps(tmp_path):
    script = textwrap.dedent("""\
        import torch


        def half_step(opt):
            opt.step()


        p = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.1)
        for i in range(6):
            p.sum().backward()
            half_step(opt)
    """)
    assert len(walk_rank(_job(tmp_path, None, script), 0, timeout_s=240).summary.step_times_ns) == 6
    record = walk_rank(_job(tmp_path, "train.py:12", script), 0, timeout_s=240)
    assert len(record.summary.step_times_ns) == 6
    # The statement at line 10 is the whole loop: it finishes once, and optimizer steps are not counted
    record = walk_rank(_job(tmp_path, "train.py:10", script), 0, timeout_s=240)
    assert len(record.summary.step_times_ns) == 1


@pytest.mark.parametrize("value, message", [
    ("train.py:abc", "needs a line number"),
    ("train.py", "needs a line number"),
    ("train.py:0", "line numbers start at 1"),
    ("1train_step", "is neither FILE.py:LINE"),
    ("a:b:c", "is neither FILE.py:LINE"),
    ("train.py:4", "line 4 of"),  # a blank line
    ("train.py:999", "line 999 of"),
    ("no_such_function", "defines no function 'no_such_function'"),
    ("train:nope", "defines no function 'nope'"),
])
def test_bad_values_are_config_errors_naming_the_key(tmp_path, value, message):
    with pytest.raises(ConfigError) as e:
        _job(tmp_path, value)
    assert str(e.value).startswith("iterations.boundary: ") and message in str(e.value)


def test_a_boundary_in_another_module_is_checked_when_it_loads(tmp_path):
    job = _job(tmp_path, "helper:nope")  # the job file cannot see into helper.py before it runs
    with pytest.raises(Exception) as e:
        walk_rank(job, 0, engine="fake", timeout_s=240)
    assert "iterations.boundary: 'helper:nope'" in str(getattr(e.value, "traceback_text", e.value))
