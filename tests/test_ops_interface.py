"""The operation registry (issue 30, item 4): a spec without an `operation` field is grpo-logits, whose
object gives the pre-plug-in inputs, reference, groupings and work terms; an unknown name is a clear error."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from grpo_conform.errors import GrpoConformError
from grpo_conform.floors import compute_floor, resolve_for_floor
from grpo_conform.hardware import load_catalogue
from grpo_conform.ops import DEFAULT_OPERATION, OPERATIONS, UnknownOperation, operation_for, operation_name
from grpo_conform.ops.grpo_logits.inputs import generate
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss
from grpo_conform.ops.interface import GradientGrouping
from grpo_conform.spec import load_member

from member_cases import FAMILY, make_inputs


def test_registry_holds_grpo_logits_and_specs_without_the_field_name_it(spec):
    assert DEFAULT_OPERATION == "grpo-logits" and set(OPERATIONS) >= {"grpo-logits"}
    assert OPERATIONS["grpo-logits"].name == "grpo-logits"
    member = load_member(FAMILY, "token-offpolicy-mask-kl")
    for s in (spec, member):  # the frozen seed file and a family member: neither has the field
        assert getattr(s, "operation", None) is None
        assert operation_name(s) == "grpo-logits" and operation_for(s) is OPERATIONS["grpo-logits"]


def test_reference_equals_the_pre_existing_reference_on_a_tiny_workload(spec):
    op = operation_for(spec)
    rw = spec.resolve(spec.workload("odd-vocab"), random.Random(5))
    x = op.generate(spec, rw, 7, "cpu", case=0)
    direct = generate(spec, rw, 7, "cpu", case=0)
    assert all(torch.equal(x[k], direct[k]) for k in direct.tensors) and x.covered == direct.covered
    values = {**spec.parameter_values, "temperature": 0.7, "epsilon_low": 0.15}
    params = op.parameters(spec, values)
    assert params == GrpoParameters.from_spec(spec, values)
    assert op.reference_loss(spec, x.tensors, params) == reference_loss(x.tensors, params)
    grads = op.reference_gradients(spec, x.tensors, params)
    assert set(grads) == {"logits"}
    flat = torch.cat([c.values for c in grads["logits"]])
    assert torch.equal(flat.view(x["logits"].shape), reference_gradient_dense(x.tensors, params))


def test_reference_of_a_member_with_every_optional_input():
    member = load_member(FAMILY, "token-offpolicy-mask-kl")
    op = operation_for(member)
    x = make_inputs(member, seed=3)
    values = dict(member.parameter_values)
    params = op.parameters(member, values)
    assert op.reference_loss(member, x, params) == reference_loss(x, params)
    flat = torch.cat([c.values for c in op.reference_gradients(member, x, params)["logits"]])
    assert torch.equal(flat.view(x["logits"].shape), reference_gradient_dense(x, params))


def test_groupings_size_description_and_work_counts(spec):
    op = operation_for(spec)
    rw = spec.resolve(spec.workload("odd-vocab"), random.Random(1))
    g = op.gradient_groupings(spec)
    assert g == {"logits": GradientGrouping("logits", ("batch", "seq_next"), ("vocab",))}
    assert g["logits"].units(rw) * g["logits"].width(rw) == rw.numel("logits")
    size = op.workload_size(spec, rw)
    assert (size.tensor, size.elements) == ("logits", rw.numel("logits"))
    assert op.describe_workload(spec, rw) == str(list(rw.shapes["logits"]))
    assert op.work_counts({"logits": torch.zeros(1)}) is None
    counted = op.work_counts({"completion_mask": torch.tensor([[1, 0], [0, 0]])})
    assert (counted.unmasked, counted.scored, counted.sequences_with_tokens) == (1, 4, 1)


def test_floor_arithmetic_comes_from_the_operation(spec):
    """The seed's forward reads only the advantages (its loss is -mean(A)): no exponential; full reads the
    scored logits rows; headroom-v1 counts every element less the never-read last position."""
    gpu = load_catalogue().gpus[0]
    rw = resolve_for_floor(spec, spec.workload("seed-b2"))
    b, sn, v = rw.shapes["logits"]
    assert compute_floor(spec, rw, "forward", gpu).exps == 0
    assert compute_floor(spec, rw, "full", gpu).exps == b * (sn - 1) * v
    assert compute_floor(spec, rw, "full", gpu, model="headroom-v1").exps == b * (sn - 1) * v
    other = SimpleNamespace(semantics=SimpleNamespace(family="other"))
    assert operation_for(spec).arithmetic(other, rw, {}).exponentials == 0


def test_an_unknown_operation_is_a_clear_error(spec):
    fake = SimpleNamespace(operation="fused-linear-nope", id="x-spec", source="specs/x.v1.json")
    with pytest.raises(UnknownOperation) as err:
        operation_for(fake)
    assert isinstance(err.value, GrpoConformError)
    text = str(err.value)
    assert "specs/x.v1.json" in text and "'operation'" in text and "fused-linear-nope" in text
    assert "grpo-logits" in text and "upgrade" in text


def test_the_shared_grpo_terms_take_any_operation_s_log_probs():
    """A fused-linear operation computes logp from hidden states and a weight, then calls the shared
    [batch, seq] terms: fed the logits' log-probs they give the logits reference's loss."""
    from grpo_conform.ops.grpo_logits.reference import reference_logprobs
    from grpo_conform.ops.grpo_terms import token_terms

    member = load_member(FAMILY, "token-offpolicy-mask-kl")
    x = make_inputs(member, seed=4)
    params = operation_for(member).parameters(member, dict(member.parameter_values))
    terms = token_terms(x, params, reference_logprobs(x, params))
    assert float(terms.loss.sum()) == pytest.approx(reference_loss(x, params), rel=1e-12, abs=1e-15)
    assert terms.dlogp.shape == x["completion_ids"].shape and bool(terms.dlogp.abs().sum() > 0)
