"""Every file prism reads back is checked against a checksum written with it.

For each kind of file (a payload and its index, a pruned record and its index, a capture's
tensors and op list, a graph rank file and manifest) and each kind of damage (a flipped byte, a
truncation, a missing file), reading through the real reader raises an IntegrityError (a
RunDirError, which the CLI renders) that starts with the damaged file's path, says what is wrong
and names the command that writes it again — never a wrong value.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from prism.coordinator.payloads import PayloadStore, load_index, load_payload
from prism.core.errors import IntegrityError, RunDirError
from prism.graph import parse_graph, read_graph, write_graph
from prism.nccl_patches import Algo, record_for_sandbox
from prism.nccl_patches.recorded_store import (
    RecordedStore,
    collective_key,
    derive_from_capture,
    read_index,
    recorded_dir,
    save_recorded,
    write_capture,
    write_index,
)

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Kind:
    """A kind of file: ``make(run)`` writes it (and its neighbours) under the run directory and
    returns the file to damage; ``read(run)`` reads it the way prism does; ``remedy``: the
    command the error must name."""

    make: Callable[[Path], Path]
    read: Callable[[Path], object]
    remedy: str
    text: bool = False  # a JSON file: a flip turns one digit into another


def _payload(run: Path) -> Path:
    store = PayloadStore(run / "payloads")
    digest = store.put([torch.arange(1000, dtype=torch.float32), torch.ones(3, dtype=torch.int64)])
    (run / "digest").write_text(digest)
    return run / "payloads" / f"{digest}.safetensors"


def _payload_index(run: Path) -> Path:
    store = PayloadStore(run / "payloads")
    digest = store.put([torch.arange(10.0)])
    for r in range(4):
        store.note(f"{r}/0/{r}/COLLECTIVE", "outputs", digest)
    store.write_index()
    return run / "payloads" / "index.json"


def _pruned_set(run: Path) -> Path:
    directory = recorded_dir(run, {1, 2})
    g = torch.Generator().manual_seed(0)
    for seq in range(3):
        inputs = [torch.randn(4096, generator=g) for _ in range(4)]
        save_recorded(directory, collective_key("0", seq, 0), record_for_sandbox(inputs, Algo.RING_ALL_REDUCE, "sum", [1, 2]))
    write_index(directory)
    return directory


def _read_pruned(run: Path) -> list:
    store = RecordedStore(recorded_dir(run, {1, 2}))
    try:
        return [store.get(collective_key("0", seq, 0)) for seq in range(3)]
    finally:
        store.close()


_OP = {"key": "c/0/0", "op": "all_reduce", "group_id": "0", "seq": 0, "group_ranks": [0, 1], "root": -1,
       "flat": False, "coalesced": False, "reduce_op": "sum", "in_splits": [], "out_splits": [],
       "num_inputs": 1, "num_outputs": 1}


def _capture(run: Path) -> None:
    for r in (0, 1):
        x = torch.full((2048,), float(r + 1))
        write_capture(run / "capture", r, {"c/0/0/in/0": x, "c/0/0/out/0": x * 0 + 3.0}, [_OP])


def _derive(run: Path) -> Path:
    try:
        return derive_from_capture(run, run / "capture", [0])
    finally:  # a failed derivation leaves no set behind
        assert not any(p.name != "ranks-0" for p in (run / "payloads" / "pruned").glob("*")), \
            list((run / "payloads" / "pruned").glob("*"))


def _graph(run: Path) -> None:
    graph = parse_graph("graph world_size=2 kind=bare\ngroup 0 ranks=0,1\n"
                        "r0#0 COLL all_reduce g0:0 4MiB f32[1048576] sum\nr1#0 COLL all_reduce g0:0 4MiB f32[1048576] sum\n")
    write_graph(graph, run / "graph" / "bare")


def _first(make, path):
    def f(run: Path) -> Path:
        make(run)
        return run / path
    return f


KINDS = {
    "payload": Kind(_payload, lambda run: load_payload(run / "payloads", (run / "digest").read_text()),
                    "prism collect"),
    "payload index": Kind(_payload_index, lambda run: load_index(run / "payloads"), "prism collect", text=True),
    "pruned record": Kind(lambda run: _pruned_set(run) / "c" / "0" / "1.0.safetensors", _read_pruned,
                          "prism emulate"),
    "pruned index": Kind(lambda run: _pruned_set(run) / "index.json", _read_pruned, "prism emulate", text=True),
    "capture tensors": Kind(_first(_capture, "capture/rank-00001.safetensors"), _derive, "prism calibrate"),
    "capture ops": Kind(_first(_capture, "capture/rank-00001.json"), _derive, "prism calibrate", text=True),
    "graph rank file": Kind(_first(_graph, "graph/bare/rank-00001.pb"), lambda run: read_graph(run / "graph/bare"),
                            "prism collect"),
    "graph manifest": Kind(_first(_graph, "graph/bare/manifest.pb"), lambda run: read_graph(run / "graph/bare"),
                           "prism collect"),
}


def _flip(path: Path, text: bool) -> None:
    data = bytearray(path.read_bytes())
    if text:  # one digit becomes another: still valid JSON, a different value
        i = next(i for i in range(len(data) // 2, len(data)) if chr(data[i]).isdigit())
        data[i] = ord("7") if data[i] != ord("7") else ord("3")
    else:  # the last byte: tensor data, or the end of the manifest
        data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path, text: bool) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _delete(path: Path, text: bool) -> None:
    path.unlink()


DAMAGE = {
    "flipped byte": (_flip, r"sha256 mismatch|does not match|corrupt"),
    "truncated": (_truncate, r"truncated|sha256 mismatch"),
    "missing": (_delete, r"missing"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("kind", list(KINDS))
def test_damage_is_named_with_the_file_and_the_remedy(tmp_path: Path, kind: str, damage: str) -> None:
    k = KINDS[kind]
    run = tmp_path / "run"
    victim = k.make(run)
    k.read(run)  # intact: reads fine
    shutil.rmtree(run / "payloads" / "pruned" / "ranks-0", ignore_errors=True)  # derived: read again below
    apply, problem = DAMAGE[damage]
    apply(victim, k.text)
    with pytest.raises(IntegrityError) as err:
        k.read(run)
    message = str(err.value)
    assert isinstance(err.value, RunDirError)
    assert message.startswith(f"{victim}: "), message
    assert re.search(problem, message), message
    assert k.remedy in message, message


def test_a_payload_replaced_after_it_was_verified_is_verified_again(tmp_path: Path) -> None:
    # Verification is once per file and process: a second read of the same file is not hashed
    # again, but a file written since (new size or time) is.
    run = tmp_path / "run"
    victim = _payload(run)
    digest = (run / "digest").read_text()
    first = load_payload(run / "payloads", digest)
    assert torch.equal(load_payload(run / "payloads", digest)[0], first[0])
    _flip(victim, text=False)
    with pytest.raises(IntegrityError, match=re.escape(f"{victim}: sha256 mismatch")):
        load_payload(run / "payloads", digest)


def test_a_pruned_set_without_index_was_not_finished(tmp_path: Path) -> None:
    directory = _pruned_set(tmp_path)
    (directory / "index.json").unlink()
    with pytest.raises(IntegrityError, match=r"index\.json: the index of the recorded data is missing; remove "):
        RecordedStore(directory)


def test_the_cli_renders_the_error_with_the_file_and_the_remedy(tmp_path: Path, run_prism) -> None:
    run = tmp_path / "run"
    victim = KINDS["graph manifest"].make(run)
    _flip(victim, text=False)
    result = run_prism("simulate", str(run), env={"COLUMNS": "1000"}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"error: {victim}: sha256 mismatch" in result.stderr, result.stderr
    assert "re-run `prism collect`" in result.stderr, result.stderr


def test_records_preloaded_and_waited_for_are_in_memory_and_a_damaged_one_fails_at_its_read(tmp_path: Path) -> None:
    # The replayer loads its records before its first op (Replayer._preload): after wait_loaded
    # every queued record is in memory, and a damaged one reports its file when it is read.
    directory = _pruned_set(tmp_path)
    keys = [collective_key("0", seq, 0) for seq in range(3)]
    _flip(directory / read_index(directory)[keys[2]]["file"], text=False)
    store = RecordedStore(directory)
    try:
        assert store.preload(keys) == 3
        assert store.wait_loaded(timeout_s=60) == 3
        assert all(store.loaded(k) for k in keys)
        assert store.get(keys[0]).inputs.keys() == {1, 2}
        with pytest.raises(IntegrityError, match="sha256 mismatch"):
            store.get(keys[2])
    finally:
        store.close()
