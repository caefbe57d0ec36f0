import pytest

from prism.core.atomic import (
    atomic_directory,
    atomic_write_text,
    install_directory,
    make_temp_dir,
    remove_stale_temporaries,
)

pytestmark = pytest.mark.timeout(30)


def test_atomic_directory_replaces_only_on_success(tmp_path):
    target = tmp_path / "graph"
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "b").write_text("2")
        raise RuntimeError("crash mid-write")
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == ["graph"], "no temporary left behind"


def test_atomic_write_text_leaves_no_temporary(tmp_path):
    atomic_write_text(tmp_path / "x" / "f.txt", "hello")
    assert (tmp_path / "x" / "f.txt").read_text() == "hello"
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["f.txt"]


def test_install_directory_replaces_the_old_directory_as_a_whole(tmp_path):
    target = tmp_path / "payloads"
    target.mkdir()
    (target / "old").write_text("old")
    new = make_temp_dir(tmp_path, "payloads")
    (new / "new").write_text("new")
    install_directory(new, target)
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["payloads"], "the old directory is removed"


def test_temporaries_of_a_killed_writer_are_removed_and_a_live_writers_are_kept(tmp_path):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    stale = tmp_path / f".bare.{dead_pid}.abc123.tmp"
    (stale / "sub").mkdir(parents=True)
    stale_file = tmp_path / f".index.json.{dead_pid}.xyz.tmp"
    stale_file.write_text("{")
    live = make_temp_dir(tmp_path, "bare")  # this process's
    other = tmp_path / ".not-ours.tmp"
    other.mkdir()
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([stale, stale_file])
    assert live.is_dir() and other.is_dir()
