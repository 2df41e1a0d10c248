"""The failure diagnosis (grpo_conform/ops/grpo_logits/diagnosis.py, issue 35 item 3): every gallery folder whose bug is
a known neighbouring semantics (`diagnosis = "VARIANT"` in its expect.toml) is named by that variant,
computed in-process on small CPU inputs (tests/member_cases.py); the variants' own baseline equals the
reference for every member; outputs that match no variant (or the reference) name none."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import GALLERY
from grpo_conform.ops.grpo_logits.diagnosis import VARIANTS, Semantics, diagnose, variant_grid
from grpo_conform.ops.grpo_logits.reference import (GrpoParameters, reference_gradient_dense, reference_logprobs, reference_loss,
                                    token_terms)
from member_cases import S, load_impl, make_inputs, member_names, member_parameters, member_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DIAGNOSED = sorted(p for p in GALLERY.iterdir() if (p / "expect.toml").is_file()
                   and "diagnosis" in tomllib.loads((p / "expect.toml").read_text()))
GRADIENT_ALLOWED = 1e-4  # relative Frobenius: these float32 implementations are ~1e-6 from float64


def _case(member: str, seed: int = 0):
    spec = member_spec(member)
    values = member_parameters(spec, seed)
    return spec, values, make_inputs(spec, seed, values), GrpoParameters.from_spec(spec, values)


def _run(fn, x, values):
    leaf = x["logits"].clone().requires_grad_(True)
    loss = fn(**{**x, "logits": leaf}, **values)
    loss.backward()
    return float(loss.detach()), leaf.grad


def _loss_allowed(x, p):
    return 1e-5 * max(1.0, abs(reference_loss(x, p)))


@pytest.mark.parametrize("member", member_names())
def test_baseline_semantics_is_the_reference(member):
    _spec, _values, x, p = _case(member)
    logp = reference_logprobs(x, p)
    loss, dlogp = variant_grid(x, p, logp, Semantics())
    terms = token_terms(x, p, logp)
    assert loss == pytest.approx(reference_loss(x, p), rel=1e-12, abs=1e-14)
    assert torch.allclose(dlogp, terms.dlogp, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("member", member_names())
def test_the_reference_itself_matches_no_variant(member):
    _spec, _values, x, p = _case(member, seed=1)
    grad = reference_gradient_dense(x, p)
    found = diagnose(x, p, reference_loss(x, p), grad, _loss_allowed(x, p), GRADIENT_ALLOWED)
    assert found.evaluated and not found.matches, found.sentence


def test_every_neighbouring_class_is_diagnosed():
    names = {p.name for p in DIAGNOSED}
    assert {"bnpo-as-grpo", "clip-ignored", "forgot-detach", "kl-k1", "mask-ignored", "micro-batch-normaliser",
            "sequence-ratio-per-token", "temperature-ignored", "is-correction-ignored"} <= names


@pytest.mark.parametrize("folder", DIAGNOSED, ids=[p.name for p in DIAGNOSED])
def test_gallery_folder_is_named(folder):
    expect = tomllib.loads((folder / "expect.toml").read_text())
    assert expect["diagnosis"] in VARIANTS
    _spec, values, x, p = _case(expect.get("member", "token-is"))
    loss, grad = _run(load_impl(folder), x, values)
    found = diagnose(x, p, loss, grad, _loss_allowed(x, p), GRADIENT_ALLOWED)
    assert found.matches and found.matches[0].name == expect["diagnosis"], found.sentence
    assert expect["diagnosis"] in found.sentence


def test_no_variant_for_an_unrelated_bug():
    # a loss offset and a doubled gradient are wrong, but not any semantics the family knows
    _spec, values, x, p = _case("token-offpolicy-mask")
    grad = reference_gradient_dense(x, p)
    found = diagnose(x, p, reference_loss(x, p) + 0.01, 2.0 * grad, _loss_allowed(x, p), GRADIENT_ALLOWED)
    assert not found.matches and "none of the" in found.sentence


def _trl_kl(logits, completion_ids, advantages, old_logprobs, completion_mask, ref_logprobs, epsilon_low,
            epsilon_high, temperature, beta, **_):
    """TRL 1.16 GRPOTrainer._compute_loss with its default use_bias_correction_kl=True: the k3 KL term
    times coef_1 (the ratio, with its gradient); grpo normaliser."""
    z = logits[:, :S].double() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = completion_mask.double()
    coef_1 = torch.exp(logp - old_logprobs.double())
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.min(coef_1 * a, torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high) * a)
    d = ref_logprobs.double() - logp
    per_token = per_token + beta * (torch.exp(d) - d - 1) * coef_1
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()


def test_trl_default_kl_is_named():
    _spec, values, x, p = _case("token-offpolicy-mask-kl")
    loss, grad = _run(_trl_kl, x, values)
    found = diagnose(x, p, loss, grad, _loss_allowed(x, p), GRADIENT_ALLOWED)
    assert [m.name for m in found.matches] == ["kl-bias-corrected"], found.sentence


def test_trl_dapo_normaliser_is_named_when_items_are_fewer_than_processes():
    # ours max(1, N / P), TRL 1.16's max(1, N) / P: different only when N < P
    spec, values, x, _p = _case("dapo-global-mask")
    values = {**values, "num_items_in_batch": 3, "num_processes": 8}
    p = GrpoParameters.from_spec(spec, values)
    grad = reference_gradient_dense(x, p) * (8 / 3)  # 1 / (3 / 8) vs 1 / 1
    loss = reference_loss(x, p) * (8 / 3)
    found = diagnose(x, p, loss, grad, _loss_allowed(x, p), GRADIENT_ALLOWED)
    assert found.matches and found.matches[0].name == "normaliser-dapo-trl", found.sentence


def test_a_diagnosis_found_on_a_later_failing_call_reaches_the_outcome():
    # The first failing call is one no variant explains; the second names the variant: the outcome
    # keeps the first call's message and evidence, and carries the match with the call it came from.
    from grpo_conform.checks.book import CheckBook

    book = CheckBook(("loss",))
    none = {"summary": "none of the 3 neighbouring semantics ...", "matches": []}
    named = {"summary": "your outputs equal ...", "matches": [{"variant": "vllm-token-truncate"}]}
    book.record("loss", "A#1", False, "call A#1: off", {"actual": 1.0, "likely_cause": none})
    book.record("loss", "A#2", False, "call A#2: off", {"actual": 2.0, "likely_cause": named})
    (outcome,) = book.outcomes()
    assert outcome.message == "call A#1: off" and outcome.evidence["actual"] == 1.0
    assert outcome.evidence["likely_cause"]["matches"] == named["matches"]
    assert outcome.evidence["likely_cause"]["call"] == "A#2"
    # with no match anywhere the first call's (empty) diagnosis stays as it was
    book = CheckBook(("loss",))
    book.record("loss", "A#1", False, "call A#1: off", {"likely_cause": none})
    book.record("loss", "A#2", False, "call A#2: off", {"likely_cause": none})
    (outcome,) = book.outcomes()
    assert outcome.evidence["likely_cause"] == none


def test_likely_cause_tries_the_next_failing_calls_until_a_match():
    from types import SimpleNamespace

    from grpo_conform.checks import judging

    seen = []

    def fake(pristine, params, loss, grad, loss_allowed, gradient_allowed, upstream):
        seen.append(loss)
        matches = ("m",) if loss == 3.0 else ()
        return SimpleNamespace(matches=matches, to_json=lambda: {"matches": list(matches)})

    run = SimpleNamespace(state={}, model=SimpleNamespace(params=None), op=SimpleNamespace(diagnosed=True))
    failed = SimpleNamespace(passed=False, allowed=1e-6, frobenius_allowed=1e-3, single=True)
    passed = SimpleNamespace(passed=True, allowed=1e-6, frobenius_allowed=1e-3, single=True)
    original = judging.diagnose
    judging.diagnose = fake
    try:
        def call(i):
            return SimpleNamespace(label=f"A#{i}", slot=SimpleNamespace(pristine={}), loss=float(i), grad=None,
                                   upstream=1.0)
        assert judging.likely_cause(run, call(1), passed, passed) is None  # never on a passing call
        results = [judging.likely_cause(run, call(i), failed, failed) for i in (2, 3, 4, 5)]
    finally:
        judging.diagnose = original
    assert seen == [2.0, 3.0]  # the second failing call matched: no further diagnosis
    assert results[0] == {"matches": []} and results[1] == {"matches": ["m"]} and results[2:] == [None, None]
    run = SimpleNamespace(state={}, model=SimpleNamespace(params=None), op=SimpleNamespace(diagnosed=True))
    seen.clear()
    judging.diagnose = fake
    try:
        for i in (10, 11, 12, 13, 14):
            judging.likely_cause(run, call(i), failed, failed)
    finally:
        judging.diagnose = original
    assert seen == [10.0, 11.0, 12.0]  # at most DIAGNOSES failing calls
    assert judging.DIAGNOSES == 3


def test_a_zero_reference_gradient_still_names_the_variant():
    # token_mask drops every token whose sampling ratio exceeds the cap: with all of them above it the
    # reference gradient is exactly 0, the check allows no difference, and a truncating kernel must
    # still be named (the CI flake of 2026-12-02: the diagnosis matched within 1e-6 relative only).
    from types import SimpleNamespace

    from grpo_conform.checks.judging import _variant_allowance

    spec, values, x, p = _case("vllm-token-mask")
    x = dict(x, sampling_ratio=torch.full_like(x["sampling_ratio"], p.sampling_ratio_cap * 1.5))
    loss, grad = _run(load_impl(GALLERY / "vllm-mask-truncated"), x, values)
    assert torch.count_nonzero(reference_gradient_dense(x, p)) == 0 and torch.count_nonzero(grad) > 0
    single = SimpleNamespace(tol=SimpleNamespace(frobenius_rtol=1e-3), slack=1.0)
    allowed = _variant_allowance(SimpleNamespace(frobenius_allowed=0.0, single=single))
    assert allowed == 1e-3
    found = diagnose(x, p, loss, grad, _loss_allowed(x, p), allowed)
    # (every ratio above the cap: sequence_truncate clamps each sequence's product to the cap too)
    assert "vllm-token-truncate" in [m.name for m in found.matches], found.sentence
    assert _variant_allowance(SimpleNamespace(frobenius_allowed=2e-3, single=single)) == 2e-3


def test_an_operation_without_the_diagnosis_gets_none():
    """grpo-fused-linear's frozen-inputs call asks for one gradient (hidden alone): the logits variants do not
    apply to it (they read `logits`); likely_cause must not run them."""
    from types import SimpleNamespace

    from grpo_conform.checks import judging
    from grpo_conform.ops import OPERATIONS

    run = SimpleNamespace(state={}, model=SimpleNamespace(params=None), op=SimpleNamespace(diagnosed=False))
    failed = SimpleNamespace(passed=False, allowed=1e-6, frobenius_allowed=1e-3, single=True)
    call = SimpleNamespace(label="FZ-hidden#1", slot=SimpleNamespace(pristine={}), loss=1.0, grad=None, upstream=1.0)
    assert judging.likely_cause(run, call, failed, failed) is None and not run.state.get("diagnosed")
    assert OPERATIONS["grpo-fused-linear"].diagnosed is False and OPERATIONS["grpo-logits"].diagnosed is True
