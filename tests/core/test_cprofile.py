"""PRISM_CPROFILE_DIR: up to Python 3.11 one cProfile file per profiled thread (CPU time); from
3.12 on, where cProfile sees every thread, one file per process; nothing when unset."""

import pstats
import threading

import pytest

from prism.core import cprofile
from prism.core.cprofile import ENV, profiled

pytestmark = pytest.mark.timeout(30)


def _busy_work() -> int:
    return sum(i * i for i in range(200_000))


def _run_in_thread(name: str) -> None:
    def body() -> None:
        with profiled("unit"):
            _busy_work()

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join(timeout=20)


def _run_concurrently(names: list[str]) -> None:
    """Every thread inside its ``profiled`` body at once (as a rank's main thread and its channel
    threads are)."""
    inside = threading.Barrier(len(names))
    errors = []

    def body() -> None:
        try:
            with profiled("unit"):
                inside.wait(timeout=10)
                _busy_work()
                inside.wait(timeout=10)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, name=n) for n in names]
    [t.start() for t in threads]
    [t.join(timeout=20) for t in threads]
    assert not errors, errors


@pytest.mark.skipif(cprofile.PROCESS_WIDE, reason="Python 3.12+: one profile per process")
def test_each_profiled_thread_writes_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "prof"))
    _run_in_thread("prism-live-c-g0")
    _run_in_thread("other/thread")
    files = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert len(files) == 2 and all(f.startswith("unit-") and f.endswith(".prof") for f in files)
    assert any("prism-live-c-g0" in f for f in files) and any("other_thread" in f for f in files)
    stats = pstats.Stats(str(tmp_path / "prof" / files[0]))
    assert any(func[2] == "_busy_work" for func in stats.stats)


@pytest.mark.skipif(cprofile.PROCESS_WIDE, reason="Python 3.12+: one profile per process")
def test_threads_profiled_at_once_each_write_their_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "prof"))
    _run_concurrently(["a", "b", "c"])
    assert sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "prof").iterdir()) == ["a.prof", "b.prof", "c.prof"]


def test_a_process_wide_profiler_is_enabled_once_and_the_other_threads_run_unprofiled(tmp_path, monkeypatch):
    """Python 3.12+ (forced here on any version): a second ``enable`` would raise "Another profiling
    tool is already active" in that thread, which is a rank's channel thread."""
    monkeypatch.setattr(cprofile, "PROCESS_WIDE", True)
    monkeypatch.setenv(ENV, str(tmp_path / "prof"))
    _run_concurrently(["main", "prism-live-c-g0", "prism-live-c-g1"])
    (only,) = list((tmp_path / "prof").iterdir())
    assert only.name.startswith("unit-") and only.name.endswith("-process.prof")
    assert any(func[2] == "_busy_work" for func in pstats.Stats(str(only)).stats)
    only.unlink()
    _run_in_thread("later")  # the profile is released with its body: a later one profiles again
    assert [p.name for p in (tmp_path / "prof").iterdir()] == [only.name]


def test_nothing_is_written_when_unset(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    _run_in_thread("t")
    assert list(tmp_path.iterdir()) == []
