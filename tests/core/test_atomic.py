import pytest

from prism.core.atomic import atomic_directory, atomic_write_text

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
