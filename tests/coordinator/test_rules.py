"""comm_inputs: rules — the rule language, the filler, hooks, and a collection whose values come from rules."""

import dataclasses
import json

import pytest
import torch

from prism.coordinator import CollectOptions, collect_job
from prism.coordinator.rules import EXACT, RuleSet, fill_outputs
from prism.core.config import CommInputs, CommRule, job_from_dict, load_job
from prism.core.errors import ConfigError, PrismError
from prism.graph.records import CommOp
from prism.rpc import CommHeader, TensorMeta
from tests.conftest import ASSETS

pytestmark = pytest.mark.timeout(60)

RULES4 = ASSETS / "jobs/rules4"


def header(op, tensors, *, outputs=None, rank=1, group=(0, 1, 2, 3), reduce_op="", root=-1, peer=-1, flat=False,
           site="train.py:10", seq=0, **kw):
    outs = tensors if outputs is None else outputs
    return CommHeader(rank=rank, op_index=0, op=op, group_id="0", group_ranks=group, seq=seq, reduce_op=reduce_op,
                      root=root, peer=peer, flat=flat, inputs=tuple(TensorMeta.of(t) for t in tensors),
                      outputs=tuple(TensorMeta.of(t) for t in outs), call_site=site, **kw)


def rules(*rs, base_dir=RULES4, **kw):
    return RuleSet(CommInputs(source="rules", rules=tuple(rs), **kw), base_dir=base_dir, world_size=4,
                   small_max_bytes=65536)


# --- the filler ---------------------------------------------------------------------------------------

def test_mirror_is_the_op_as_if_every_member_handed_in_this_ranks_inputs():
    x = torch.tensor([1.0, 2.0])
    assert fill_outputs("mirror", header("all_reduce", [x], reduce_op="sum"), [x])[0].tolist() == [4.0, 8.0]
    assert fill_outputs("mirror", header("all_reduce", [x], reduce_op="avg"), [x])[0].tolist() == [1.0, 2.0]
    assert fill_outputs("mirror", header("all_reduce", [x], reduce_op="product"), [x])[0].tolist() == [1.0, 16.0]
    flat = torch.empty(8)
    assert fill_outputs("mirror", header("all_gather", [x], outputs=[flat], flat=True), [x])[0].tolist() == [1, 2] * 4
    chunks = torch.arange(8.0)
    (rs,) = fill_outputs("mirror", header("reduce_scatter", [chunks], outputs=[torch.empty(2)], flat=True,
                                          reduce_op="sum"), [chunks])
    assert rs.tolist() == [8.0, 12.0]  # rank 1's chunk [2, 3], summed over 4 identical members
    assert fill_outputs("mirror", header("broadcast", [], outputs=[x], root=0), []) == []  # the buffer stays
    assert fill_outputs("mirror", header("recv", [], outputs=[x], peer=0), [])[0].tolist() == [1.0, 1.0]
    assert fill_outputs("zeros", header("all_reduce", [x], reduce_op="sum"), [x])[0].tolist() == [0.0, 0.0]


def test_uneven_all_to_all_mirror_returns_own_input_or_zeros_when_sizes_differ():
    x = torch.ones(6, 2)
    same = header("all_to_all", [x], outputs=[torch.empty(6, 2)], flat=True)
    assert torch.equal(fill_outputs("mirror", same, [x])[0], x)
    other = header("all_to_all", [x], outputs=[torch.empty(5, 2)], flat=True)
    assert fill_outputs("mirror", other, [x])[0].abs().sum() == 0


# --- the rules ----------------------------------------------------------------------------------------

def test_first_matching_rule_wins_and_values_broadcast_to_the_output():
    rs = rules(CommRule(op=("all_reduce",), call_site="train.py:1*", value=2.5),
               CommRule(op=("all_reduce",), value=[1, 2]))
    x = torch.zeros(2, 3)
    assert rs.decide(header("all_reduce", [x], site="train.py:12"), [x])[0].tolist() == [[2.5] * 3] * 2
    (out,) = rs.decide(header("all_reduce", [torch.zeros(3, 2)], site="model.py:3"), [torch.zeros(3, 2)])
    assert out.tolist() == [[1, 2]] * 3
    assert rs.num_applied == [1, 1]


def test_small_integer_ops_are_exact_by_default_and_the_rest_is_filler():
    rs = rules()
    counts = torch.zeros(8, dtype=torch.int64)
    assert rs.decide(header("all_to_all", [counts]), [counts]) is EXACT
    big = torch.zeros(20000, dtype=torch.int64)  # 160 KB > values.small_max_bytes
    assert rs.decide(header("all_to_all", [big]), [big]) is not EXACT
    grad = torch.ones(3)
    assert rs.decide(header("all_reduce", [grad], reduce_op="sum"), [grad])[0].tolist() == [4.0] * 3
    assert rules(control_flow="filler").decide(header("all_to_all", [counts]), [counts]) is not EXACT


def test_rules_match_on_dtype_group_size_ranks_and_bytes():
    rs = rules(CommRule(dtype=("i64",), group_size=2, ranks="1", max_bytes=8, value=9))
    one = torch.zeros(1, dtype=torch.int64)
    assert rs.decide(header("all_reduce", [one], group=(0, 1)), [one])[0].item() == 9
    assert rs.decide(header("all_reduce", [one], group=(0, 1), rank=0), [one]) is EXACT      # other rank
    assert rs.decide(header("all_reduce", [one]), [one]) is EXACT                              # group of 4
    two = torch.zeros(2, dtype=torch.int64)
    assert rs.decide(header("all_reduce", [two], group=(0, 1)), [two]) is EXACT                # 16 B > 8 B


def test_a_hook_gets_the_op_and_the_ranks_inputs():
    rs = rules(CommRule(op=("all_to_all",), hook="rules.py:recv_counts"))
    counts = torch.arange(4, dtype=torch.int64)
    (out,) = rs.decide(header("all_to_all", [counts], rank=2, seq=5), [counts])
    assert out.tolist() == [10 * s + 2 + 5 for s in range(4)] and out.dtype == torch.int64


def test_a_hook_that_returns_the_wrong_size_is_named(tmp_path):
    (tmp_path / "bad_hook.py").write_text("import torch\ndef f(op, inputs):\n    return torch.zeros(3)\n")
    rs = rules(CommRule(op=("all_reduce",), hook="bad_hook.py:f"), base_dir=tmp_path)
    x = torch.zeros(2)
    with pytest.raises(PrismError, match=r"comm_inputs.rules\[0\].hook bad_hook.py:f on rank 1 all_reduce "
                                         r"0:0 at train.py:10: a value of shape \(3,\) does not fit"):
        rs.decide(header("all_reduce", [x]), [x])


def test_a_hook_that_cannot_be_imported_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"comm_inputs.rules\[0\].hook: rules.py has no function 'nope'"):
        rules(CommRule(hook="rules.py:nope"))
    with pytest.raises(ConfigError, match=r"comm_inputs.rules\[0\].hook: cannot import no_such_pkg.mod"):
        rules(CommRule(hook="no_such_pkg.mod:f"))


BASE = {"name": "x", "entrypoint": "train.py", "world_size": 4}


@pytest.mark.parametrize(("rules_yaml", "message"), [
    ([{"op": "send", "value": 1}], r"comm_inputs.rules\[0\].op: unknown op 'send' \(a send has no output"),
    ([{"op": "all_reduce"}], r"comm_inputs.rules\[0\]: needs exactly one action: value, fill or hook"),
    ([{"op": "all_reduce", "value": 1, "fill": "zeros"}], r"comm_inputs.rules\[0\]: needs exactly one action.*got "
                                                         r"value, fill"),
    ([{"value": 1}, {"value": "one"}], r"comm_inputs.rules\[1\].value: expected a number"),
    ([{"fill": "exact", "ranks": "0"}], r"comm_inputs.rules\[0\].ranks: an 'exact' rule must hold for every member"),
    ([{"fill": "random"}], r"comm_inputs.rules\[0\].fill: must be one of mirror, zeros, ones, exact"),
    ([{"dtype": "f33", "value": 1}], r"comm_inputs.rules\[0\].dtype: unknown dtype 'f33'"),
    ([{"callsite": "x", "value": 1}], r"comm_inputs.rules\[0\].callsite: unknown key"),
    ([{"hook": "gone.py:f"}], r"comm_inputs.rules\[0\].hook: file not found"),
    ([{"hook": "rules.py"}], r"comm_inputs.rules\[0\].hook: expected 'file.py:function'"),
    ({"op": "x"}, r"comm_inputs.rules: expected a list of mappings"),
])
def test_bad_rules_name_the_dotted_key(rules_yaml, message):
    with pytest.raises(ConfigError, match=message):
        job_from_dict({**BASE, "comm_inputs": {"source": "rules", "rules": rules_yaml}}, base_dir=RULES4)


def test_a_rule_file_loads_into_frozen_rules():
    job = load_job(RULES4 / "job.yaml")
    assert job.comm_inputs.source == "rules"
    assert job.comm_inputs.rules[2] == CommRule(op=("all_to_all",), dtype=("i64",), hook="rules.py:recv_counts")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.comm_inputs.rules[0].value = 3


# --- a collection ---------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_collect_with_rules_gives_the_script_the_rules_values(tmp_path):
    job = load_job(RULES4 / "job.yaml")
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    job = dataclasses.replace(job, args=(str(seen_dir),))
    result = collect_job(job, tmp_path / "run", CollectOptions(slots=2, timeout_s=500))
    for rank in range(4):
        seen = json.loads((seen_dir / f"rank-{rank}.json").read_text())
        assert seen["status"] == [7]                                      # value rule
        assert seen["scale"] == [2.5]                                     # value rule, by call site
        assert seen["recv_counts"] == [10 * s + rank + 2 for s in range(4)]  # hook (seq 2 on the world group)
        assert seen["grad"] == [4.0 * (rank + 1)] * 3                     # mirror: sum of 4 copies
        assert seen["flag"] == [1]                                        # built-in rule: exact max over ranks
    # the graph's uneven all-to-all carries the hook's split sizes
    a2a = [n for n in result.graph.nodes[1] if n.op is CommOp.ALL_TO_ALL and n.out_splits]
    assert a2a[0].out_splits == tuple(10 * s + 1 + 2 for s in range(4))
    assert result.num_by_rule == 4 * 5  # 5 of 6 ops per rank; the MAX flag met on the executor
    assert result.num_collectives == 1
