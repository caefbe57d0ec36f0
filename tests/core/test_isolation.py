"""The snapshot of a script's folder (prism.core.isolation): what is copied, what is linked, what is
left out, and when it is taken again."""

import dataclasses
import os
from pathlib import Path

import pytest

from prism.core.config import Isolation, job_from_dict
from prism.core.errors import ConfigError
from prism.core.isolation import isolated_run, snapshot_source


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "model.py").write_text("X = 1\n")
    (src / "pkg" / "__pycache__").mkdir()
    (src / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0" * 10)
    (src / "data").mkdir()
    (src / "data" / "shard-0.bin").write_bytes(b"\1" * 100)
    (src / "weights.bin").write_bytes(b"\2" * 2000)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref\n")
    old_run = src / "old-run"  # an earlier prism run directory inside the folder
    (old_run / "graph").mkdir(parents=True)
    (old_run / "job.yaml").write_text("name: x\n")
    return src


def job_in(folder, **isolation):
    return job_from_dict({"name": "t", "entrypoint": "train.py", "world_size": 2, "isolation": isolation},
                         base_dir=folder)


def test_the_snapshot_copies_code_links_shared_and_large_entries_and_leaves_out_caches(folder, tmp_path):
    job = job_in(folder, share=["data"], max_copy_bytes=1000)
    snap = snapshot_source(job, tmp_path / "run", refresh=False)
    assert (snap / "train.py").read_text() == "print('hi')\n" and not (snap / "train.py").is_symlink()
    assert (snap / "pkg" / "model.py").is_file() and not (snap / "pkg" / "model.py").is_symlink()
    for linked in ("data", "weights.bin", ".git"):
        assert (snap / linked).is_symlink() and os.readlink(snap / linked) == str(folder / linked), linked
    assert not (snap / "pkg" / "__pycache__").exists()
    assert not (snap / "old-run").exists()


def test_the_snapshot_is_taken_again_only_when_asked_and_the_folder_changed(folder, tmp_path):
    job = job_in(folder)
    snap = snapshot_source(job, tmp_path / "run", refresh=False)
    (folder / "train.py").write_text("print('edited')\n")
    assert (snapshot_source(job, tmp_path / "run", refresh=False) / "train.py").read_text() == "print('hi')\n"
    assert (snapshot_source(job, tmp_path / "run", refresh=True) / "train.py").read_text() == "print('edited')\n"
    assert snap.is_dir()


def test_a_run_directory_inside_the_script_folder_is_not_copied_into_itself(folder):
    job = job_in(folder)
    with isolated_run(job, folder / "runs" / "r1", "record") as ws:
        assert (folder / "runs" / "r1" / "work") in Path(ws.cwd).parents
        assert not (Path(ws.cwd) / "runs" / "r1").exists()
        (Path(ws.cwd) / "out.txt").write_text("x")
    assert (folder / "runs" / "r1" / "outputs" / "record" / "out.txt").read_text() == "x"
    assert ws.outside == []


def test_off_runs_in_the_folder_itself(folder, tmp_path):
    job = dataclasses.replace(job_in(folder), isolation=Isolation(mode="off"))
    with isolated_run(job, tmp_path / "run", "record") as ws:
        assert ws.cwd == str(folder) and ws.entrypoint == str(folder / "train.py")
    assert not (tmp_path / "run" / "source").exists()


@pytest.mark.parametrize("isolation, key", [({"mode": "overlay"}, "isolation.mode"),
                                            ({"share": "data"}, "isolation.share"),
                                            ({"max_copy_bytes": -1}, "isolation.max_copy_bytes"),
                                            ({"extras": []}, "isolation.extras")])
def test_a_wrong_isolation_key_names_itself(folder, isolation, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        job_in(folder, **isolation)
