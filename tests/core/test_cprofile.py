"""PRISM_CPROFILE_DIR: one cProfile file per profiled thread, CPU time, nothing when unset."""

import pstats
import threading

import pytest

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


def test_each_profiled_thread_writes_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "prof"))
    _run_in_thread("prism-live-c-g0")
    _run_in_thread("other/thread")
    files = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert len(files) == 2 and all(f.startswith("unit-") and f.endswith(".prof") for f in files)
    assert any("prism-live-c-g0" in f for f in files) and any("other_thread" in f for f in files)
    stats = pstats.Stats(str(tmp_path / "prof" / files[0]))
    assert any(func[2] == "_busy_work" for func in stats.stats)


def test_nothing_is_written_when_unset(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    _run_in_thread("t")
    assert list(tmp_path.iterdir()) == []
