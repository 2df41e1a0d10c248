"""The fused-linear spec family (specs/grpo-fused-linear.v1.json) and the loader's per-operation
cross-checks (grpo_conform/spec/operation_inputs.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from grpo_conform.ops import OPERATIONS
from grpo_conform.spec import SpecError, find_spec, load_family, resolve_member_document, spec_from_document
from grpo_conform.spec.operation_inputs import OPERATION_INPUTS

ROOT = Path(__file__).resolve().parent.parent
FUSED = ROOT / "specs" / "grpo-fused-linear.v1.json"
GRPO = ROOT / "specs" / "grpo.v1.json"


def _doc():
    return json.loads(FUSED.read_text(encoding="utf-8"))


def _load(doc, member):
    return spec_from_document(resolve_member_document(doc, member, "fused.json"), "fused.json")


def test_every_registered_operation_states_its_input_requirements():
    assert set(OPERATIONS) <= set(OPERATION_INPUTS)
    for name, op in OPERATIONS.items():
        assert op.requirements is OPERATION_INPUTS[name]


def test_the_family_loads_by_id_with_the_members_issue_31_asks_for():
    fam = load_family(FUSED)
    assert {"token-is", "token-offpolicy-mask", "token-offpolicy-mask-kl", "token-offpolicy-mask-kl-ref-weight",
            "bnpo-mask", "dr-grpo-mask", "dapo-mask", "sequence-offpolicy-mask"} <= set(fam.member_names)
    spec = find_spec("grpo-fused-linear/token-is")
    assert spec.operation == "grpo-fused-linear" and spec.identity == fam.member("token-is").identity
    cpu = {w.name: w.axes for w in spec.workloads_for("cpu")}
    assert cpu["tiny-bf16"] == {"batch": 2, "seq": 8, "hidden": 32, "vocab": 257}
    cuda = {w.name: (w.axes["batch"], w.axes["seq"], w.axes["hidden"], w.axes["vocab"]) for w in spec.workloads_for("cuda")}
    assert {f"seed-b{b}": (b, 1024, 4096, 128256) for b in (2, 4, 8, 16)}.items() <= cuda.items()
    assert "mid-bf16" in cuda


def test_the_fused_family_shares_the_grpo_familys_parameters_and_cases():
    fused, grpo = _doc(), json.loads(GRPO.read_text(encoding="utf-8"))
    assert fused["common"]["parameters"] == grpo["common"]["parameters"]
    assert fused["common"]["cases"] == grpo["common"]["cases"]
    g = {m["name"]: m for m in grpo["members"]}
    for m in fused["members"]:
        base = g.get(m["name"])
        if base is not None:
            assert m["parameters"] == base["parameters"] and m["terms"] == base["terms"], m["name"]
            assert m["semantics"]["reduction"] == base["semantics"]["reduction"]
            assert m.get("cases") == base.get("cases")


def test_the_input_order_the_kernels_call_with():
    """The Triton fused kernel calls fn(hidden, weight, [bias], completion_ids, advantages, old_logprobs,
    ref_logprobs, completion_mask, **parameters): the member's inputs keep that order."""
    order = ["hidden", "weight", "bias", "completion_ids", "advantages", "old_logprobs", "ref_logprobs", "completion_mask"]
    for m in load_family(FUSED).members():
        names = [t.name for t in m.inputs if t.name in order]
        assert names == [n for n in order if n in names], m.id


@pytest.mark.parametrize("mutate, path, words", [
    (lambda m: m.update(inputs=[n for n in m["inputs"] if n != "weight"]), "$.inputs", "needs the input 'weight'"),
    (lambda m: m.update(gradients=m["gradients"][:1]), "$.gradients", "'weight' has no gradient"),
    (lambda m: m["traffic"]["full"].update(write=m["traffic"]["full"]["write"][:1]), "$.traffic.full.write", "grad:weight"),
])
def test_the_cross_checks_ask_what_the_operation_needs(mutate, path, words):
    doc = _doc()
    member = next(m for m in doc["members"] if m["name"] == "token-is")
    mutate(member)
    with pytest.raises(SpecError) as err:
        _load(doc, "token-is")
    assert err.value.path == path and words in err.value.problem


def test_a_kl_term_takes_given_ref_logprobs_or_a_reference_weight():
    doc = _doc()
    assert _load(doc, "token-offpolicy-mask-kl-ref-weight").terms.kl.present
    bad = copy.deepcopy(doc)
    member = next(m for m in bad["members"] if m["name"] == "token-offpolicy-mask-kl-ref-weight")
    member["inputs"] = [n for n in member["inputs"] if n not in ("ref_weight", "ref_hidden")]
    for w in member["workloads"]:
        w["dtypes"] = {k: v for k, v in w["dtypes"].items() if k not in ("ref_weight", "ref_hidden")}
    with pytest.raises(SpecError) as err:
        _load(bad, member["name"])
    assert "ref_logprobs or ref_weight" in err.value.problem


def test_the_logits_specs_keep_their_rule_and_their_identities():
    seed = json.loads((ROOT / "specs" / "grpo-token-is.v1.json").read_text(encoding="utf-8"))
    seed["inputs"][1]["differentiable"] = True
    with pytest.raises(SpecError) as err:
        spec_from_document(seed, "seed.json")
    assert err.value.problem == "exactly one input must be differentiable, found 2"
