"""Recorded data round-trips through RUN/payloads/pruned/ bit for bit, and the collector's entry
point stores exactly what record_for_sandbox computes for the values ranks of a group."""

import pytest
import torch
from safetensors.torch import load_file

from prism.core.tensorfile import read_safetensors
from prism.nccl_patches import Algo, record_for_sandbox
from prism.nccl_patches.recorded_store import (
    collective_key,
    load_recorded,
    p2p_key,
    record_for_values_ranks,
    record_p2p_for_values_ranks,
    recorded_dir,
    save_recorded,
    write_index,
)

pytestmark = pytest.mark.timeout(60)


def _same(a, b):
    assert a.algo is b.algo and a.group_size == b.group_size and a.sandbox == b.sandbox
    assert (a.reduce_op, a.root, a.peer, a.row_numel) == (b.reduce_op, b.root, b.peer, b.row_numel)
    for name in ("inputs", "outputs", "entry_partials", "subtree_partials"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.keys() == y.keys(), name
        for k in x:
            assert x[k].dtype == y[k].dtype and torch.equal(x[k].view(-1), y[k].view(-1)), (name, k)
    assert dict(a.in_splits) == dict(b.in_splits) and dict(a.out_splits) == dict(b.out_splits)


@pytest.mark.parametrize("algo, op", [(Algo.RING_ALL_REDUCE, "sum"), (Algo.RING_REDUCE_SCATTER, "avg"),
                                      (Algo.TREE_ALL_REDUCE, "max"), (Algo.RING_ALL_GATHER, ""),
                                      (Algo.CHAIN_BROADCAST, ""), (Algo.DIRECT_ALL_TO_ALL, "")])
def test_round_trip(tmp_path, algo, op):
    g = torch.Generator().manual_seed(3)
    n = 6
    inputs = [torch.randn(12, generator=g) for _ in range(n)]
    splits = [(2, 2, 2, 2, 2, 2)] * n if algo is Algo.DIRECT_ALL_TO_ALL else None
    rec = record_for_sandbox(inputs, algo, op, [1, 4], root=2, in_splits=splits)
    save_recorded(tmp_path, collective_key("7", 3, 0), rec)
    _same(load_recorded(tmp_path, collective_key("7", 3, 0)), rec)
    assert load_recorded(tmp_path, collective_key("7", 4, 0)) is None


def test_collector_entry_point_records_the_values_ranks_of_the_group(tmp_path):
    g = torch.Generator().manual_seed(5)
    members = (1, 3, 5, 7)
    inputs = [[torch.randn(3, 4, generator=g), torch.randn(5, generator=g)] for _ in members]
    keys = record_for_values_ranks(tmp_path, "g", 11, "all_reduce", "sum", members, inputs, values_ranks={3, 6})
    assert keys == [collective_key("g", 11, 0), collective_key("g", 11, 1)]
    directory = recorded_dir(tmp_path, {3, 6})
    for part in (0, 1):
        want = record_for_sandbox([x[part] for x in inputs], Algo.RING_ALL_REDUCE, "sum", [1])
        _same(load_recorded(directory, keys[part]), want)
    assert record_for_values_ranks(tmp_path, "h", 0, "all_reduce", "sum", (0, 2), inputs[:2], {3, 6}) == []
    msg = torch.arange(6.0)
    (key,) = record_p2p_for_values_ranks(tmp_path, "pp", (2, 6), 6, 2, 4, [msg], {2, 5})
    assert key == p2p_key("pp", 6, 2, 4, 0)
    rec = load_recorded(recorded_dir(tmp_path, {2, 5}), key)
    assert rec.algo is Algo.P2P and (rec.root, rec.peer) == (1, 0) and torch.equal(rec.outputs[0], msg)
    assert set(write_index(directory)) == set(keys)


def test_check_files_names_a_missing_or_cut_file_before_anything_reads_it(tmp_path):
    from prism.core.errors import IntegrityError
    from prism.nccl_patches.recorded_store import check_files

    inputs = [torch.arange(12, dtype=torch.float32) + r for r in range(4)]
    for seq in (1, 2):
        save_recorded(tmp_path, collective_key("0", seq, 0), record_for_sandbox(inputs, Algo.RING_ALL_REDUCE, "sum", [1]))
    write_index(tmp_path)
    assert check_files(tmp_path) == 2
    first, second = sorted(tmp_path.glob("c/0/*.safetensors"))
    second.write_bytes(second.read_bytes()[:-8])
    with pytest.raises(IntegrityError, match=rf"{second.name}: recorded data of c/0/2/0 is truncated or replaced"):
        check_files(tmp_path)
    first.unlink()
    with pytest.raises(IntegrityError, match=rf"{first.name}: recorded data of c/0/1/0 is missing \(listed in index.json\)"):
        check_files(tmp_path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool,
                                   torch.complex64])
def test_records_of_every_dtype_read_back_as_safetensors_reads_them(tmp_path, dtype):
    """prism reads a record with plain reads (no mapping of the file, docs/emulate.md):
    the same tensors, dtypes, shapes and bytes as safetensors' own loader."""
    g = torch.Generator().manual_seed(5)
    inputs = [(torch.randn(6, 2, generator=g) * 50).to(dtype) for _ in range(4)]
    rec = record_for_sandbox(inputs, Algo.RING_ALL_GATHER, "", [2])
    key = collective_key("3", 9, 0)
    save_recorded(tmp_path, key, rec)
    _same(load_recorded(tmp_path, key), rec)
    path = next(tmp_path.rglob("*.safetensors"))
    tensors, meta = read_safetensors(path)
    theirs = load_file(str(path))
    assert tensors.keys() == theirs.keys() and meta["algo"] == Algo.RING_ALL_GATHER.value
    for name, t in tensors.items():
        assert t.dtype == theirs[name].dtype and t.shape == theirs[name].shape, name
        assert torch.equal(t.reshape(-1).view(torch.uint8), theirs[name].reshape(-1).view(torch.uint8)), name


def _flip_inside(path, name: str) -> None:
    """Flip one byte in the middle of tensor ``name``'s data."""
    import json

    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    begin, end = json.loads(data[8 : 8 + n])[name]["data_offsets"]
    data[8 + n + (begin + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _ring_record(tmp_path):
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(64, generator=g) for _ in range(4)]
    rec = record_for_sandbox(inputs, Algo.RING_ALL_REDUCE, "sum", [1])
    key = collective_key("0", 2, 0)
    save_recorded(tmp_path, key, rec)
    return key, rec, next(tmp_path.rglob("*.safetensors"))


def test_a_sandbox_rank_reads_only_its_own_input_of_a_record_verified(tmp_path):
    """The live engine needs its own input of a ring record (the divergence flag); the record also
    holds what the replayer needs (entry partials, outputs): read in part, each tensor is checked
    against its own digest, and a damaged tensor that was not read is the replayer's to find."""
    from prism.core.errors import IntegrityError

    key, rec, path = _ring_record(tmp_path)
    part = load_recorded(tmp_path, key, select="in.1".__eq__)
    assert part.inputs.keys() == {1} and torch.equal(part.inputs[1], rec.inputs[1])
    assert not part.outputs and not part.entry_partials and (part.algo, part.sandbox) == (rec.algo, rec.sandbox)
    entry = next(name for name in read_safetensors(path)[0] if name.startswith("entry."))
    _flip_inside(path, entry)
    assert torch.equal(load_recorded(tmp_path, key, select="in.1".__eq__).inputs[1], rec.inputs[1])
    with pytest.raises(IntegrityError, match=rf"sha256 mismatch in the recorded data of {key}: tensor {entry}"):
        load_recorded(tmp_path, key)
    _flip_inside(path, "in.1")
    with pytest.raises(IntegrityError, match=rf"sha256 mismatch in the recorded data of {key}: tensor in\.1"):
        load_recorded(tmp_path, key, select="in.1".__eq__)


def test_a_record_whose_digests_were_edited_fails_as_a_whole(tmp_path):
    """The per-tensor digests are part of the metadata the record's own sha256 covers: a file
    whose digest of a tensor was rewritten to match a changed tensor still fails."""
    import json

    from safetensors.torch import save_file

    from prism.core.errors import IntegrityError
    from prism.nccl_patches.recorded_store import TENSOR_DIGESTS, tensors_sha256

    key, rec, path = _ring_record(tmp_path)
    tensors, meta = read_safetensors(path)
    tensors["in.1"] = tensors["in.1"] + 1
    digests = json.loads(meta[TENSOR_DIGESTS])
    digests["in.1"] = tensors_sha256({"in.1": tensors["in.1"]})
    save_file(tensors, str(path), metadata={**meta, TENSOR_DIGESTS: json.dumps(digests, sort_keys=True)})
    with pytest.raises(IntegrityError, match=rf"sha256 mismatch in the recorded data of {key}: its content"):
        load_recorded(tmp_path, key, select="in.1".__eq__)


def test_a_record_written_before_per_tensor_digests_is_read_whole_and_verified(tmp_path):
    from safetensors.torch import save_file

    from prism.core.errors import IntegrityError
    from prism.nccl_patches.recorded_store import TENSOR_DIGESTS, record_sha256

    key, rec, path = _ring_record(tmp_path)
    tensors, meta = read_safetensors(path)
    del meta[TENSOR_DIGESTS]
    meta["sha256"] = record_sha256(tensors, meta)  # as an older prism wrote it
    save_file(tensors, str(path), metadata=meta)
    _same(load_recorded(tmp_path, key, select="in.1".__eq__), rec)
    _flip_inside(path, next(name for name in tensors if name.startswith("entry.")))
    with pytest.raises(IntegrityError, match=rf"sha256 mismatch in the recorded data of {key}: its content"):
        load_recorded(tmp_path, key, select="in.1".__eq__)


def test_the_live_engine_reads_its_own_input_of_a_ring_record_and_a_tree_record_whole(tmp_path):
    from prism.sandbox.engines.base import GroupHandle
    from prism.sandbox.engines.live import LiveEngine

    g = torch.Generator().manual_seed(9)
    inputs = [torch.randn(32, generator=g) for _ in range(4)]
    ring, tree = collective_key("5", 0, 0), collective_key("5", 1, 0)
    save_recorded(tmp_path, ring, record_for_sandbox(inputs, Algo.RING_ALL_REDUCE, "sum", [2]))
    save_recorded(tmp_path, tree, whole := record_for_sandbox(inputs, Algo.TREE_ALL_REDUCE, "sum", [2]))
    write_index(tmp_path)
    engine = LiveEngine(rank=6, world_size=8, sandbox=[6], transport_store="127.0.0.1:1", recorded_dir=str(tmp_path))
    try:
        engine.create_group(GroupHandle("5", (0, 2, 6, 7), 2), store=None)  # group rank 2; no transport yet
        own = engine._recorded.get(ring)
        assert own.inputs.keys() == {2} and torch.equal(own.inputs[2], inputs[2])
        assert not own.outputs and not own.entry_partials
        _same(engine._recorded.get(tree), whole)
    finally:
        engine._recorded.close()
