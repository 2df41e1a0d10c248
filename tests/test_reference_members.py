"""The float64 reference for every family member against autograd in float64 (written the way TRL
writes its loss: torch.min, torch.clamp, detach), the tie rule, masks, chunking, and the inputs
grpo_conform.ops.grpo_logits.member_inputs draws."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_conform.ops.grpo_logits.inputs import generate
from grpo_conform.ops.grpo_logits.generators.logprob_gaps import far_ratio_inputs
from grpo_conform.ops.grpo_logits.member_inputs import boundary_tie, exact_tie_inputs, ratio_intervals
from grpo_conform.ops.grpo_logits.reference import (
    GrpoParameters, chunked_gradient, chunked_loss, reference_gradient_dense, reference_logprobs, reference_loss, row_scales,
)
from grpo_conform.spec import draw_parameters, find_spec

MEMBERS = ["token-is", "token-offpolicy-mask", "token-offpolicy-mask-kl", "bnpo-mask", "dr-grpo-mask", "dapo-mask",
           "sequence-offpolicy-mask", "token-offpolicy-mask-delta", "cispo-mask", "dapo-global-mask", "vllm-is-mask",
           "token-offpolicy-mask-kl-bc", "vllm-token-mask", "vllm-sequence-truncate", "vllm-sequence-mask",
           "dapo-global-accum-mask",
           "sapo-mask", "luspo-mask", "luspo-sequence-mask", "vespo-mask"]


def autograd_loss(x, p: GrpoParameters):
    """An independent float64 formulation on a float64 leaf; returns (loss, d loss / d logits)."""
    leaf = x["logits"].detach().to(torch.float64).requires_grad_(True)
    ids = x["completion_ids"]
    batch, seq = ids.shape
    logp = torch.log_softmax(leaf[:, :seq, :] / p.temperature, dim=-1).gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    m = (x["completion_mask"] != 0).double() if "completion_mask" in x else torch.ones(batch, seq, dtype=torch.float64)
    old = x["old_logprobs"].double() if "old_logprobs" in x else logp.detach()
    log_ratio = (logp - old) * m
    if p.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    ratio = coef_1  # TRL 1.16 multiplies the KL by coef_1 before the delta clamp rebinds it
    A = x["advantages"].double().unsqueeze(-1)
    if p.loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=p.epsilon_high).detach() * A * logp
    elif p.loss_type == "sapo":  # TRL 1.16 _compute_loss, written the same way
        tau = torch.where(A > 0, A.new_tensor(p.sapo_temperature_pos), A.new_tensor(p.sapo_temperature_neg))
        per_token = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * A
    elif p.loss_type == "vespo":  # TRL 1.16 get_gamma_weights (under no_grad), then -phi * A * logp
        with torch.no_grad():
            u = torch.clamp((torch.clamp(log_ratio, -20.0, 20.0) * m).sum(-1, keepdim=True), math.log(1e-8), 20.0)
            k = torch.where(A >= 0, A.new_tensor(p.vespo_k_pos), A.new_tensor(p.vespo_k_neg))
            lam = torch.where(A >= 0, A.new_tensor(p.vespo_lambda_pos), A.new_tensor(p.vespo_lambda_neg)).clamp(min=1e-4)
            phi = torch.exp(lam + k * u - lam * torch.exp(u)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        per_token = -phi * A * logp
    else:
        coef_2 = torch.clamp(coef_1, 1 - p.epsilon_low, 1 + p.epsilon_high)
        if p.delta is not None:
            coef_1 = torch.clamp(coef_1, max=p.delta)
        per_token = -torch.min(coef_1 * A, coef_2 * A)
    per_token = per_token.expand(batch, seq)
    if "sampling_ratio" in x:  # TRL 1.16 _generate_and_score_completions, from per-token log-ratios
        diff = torch.log(x["sampling_ratio"].double()) * m
        mode = p.vllm_importance_sampling_mode
        is_ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
        if mode.endswith("truncate"):
            is_ratio = torch.clamp(is_ratio, max=p.sampling_ratio_cap)
        else:
            is_ratio = is_ratio.masked_fill(is_ratio > p.sampling_ratio_cap, 0.0)
        per_token = per_token * is_ratio
    if "ref_logprobs" in x and p.beta:
        d = x["ref_logprobs"].double() - logp
        kl = torch.exp(d) - d - 1
        if p.use_bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + p.beta * kl
    if p.loss_type in ("grpo", "sapo"):
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif p.loss_type == "luspo":
        loss = (per_token * m).sum(-1).mean()
    elif p.loss_type == "dr_grpo":
        loss = (per_token * m).sum() / (batch * p.max_completion_length)
    elif p.gradient_accumulation_steps is not None:  # TRL 1.16, training mode
        normalizer = torch.tensor(float(p.num_items_in_batch), dtype=torch.float64).clamp(min=1.0) / p.num_processes
        normalizer = normalizer * p.gradient_accumulation_steps / p.steps_per_generation
        loss = (per_token * m).sum() / normalizer
    elif p.num_items_in_batch is not None:
        loss = (per_token * m).sum() / max(1.0, p.num_items_in_batch / p.num_processes)
    else:
        loss = (per_token * m).sum() / m.sum().clamp(min=1.0)
    loss.backward()
    return float(loss.detach()), leaf.grad


def _member_inputs(member, workload, seed, values=None):
    spec = find_spec(f"grpo/{member}")
    rw = spec.resolve(spec.workload(workload), random.Random(seed))
    values = values if values is not None else draw_parameters(spec, random.Random(seed))
    x = generate(spec, rw, seed, "cpu", values=values).tensors
    return spec, x, values, GrpoParameters.from_spec(spec, values)


def _assert_close(grad, ref):
    assert ref.dtype == torch.float64
    assert float((grad - ref).norm()) <= 1e-12 * float(ref.norm()) + 1e-300
    assert float((grad - ref).abs().max()) <= 1e-12 * float(ref.abs().max())


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("seed", [1, 2])
def test_closed_form_matches_autograd_for_every_member(member, seed):
    workload = "small-bf16" if member == "token-is" else "mask-small-bf16"
    spec, x, values, p = _member_inputs(member, workload, seed)
    assert abs(p.temperature - 1.0) >= 0.05
    loss, grad = autograd_loss(x, p)
    assert reference_loss(x, p) == pytest.approx(loss, rel=1e-12, abs=1e-15)
    _assert_close(grad, reference_gradient_dense(x, p))
    assert float(grad.abs().max()) > 0


def test_the_semantics_really_differ_between_members():
    """The same inputs under each member's parameters give different losses (nothing collapses), except
    bnpo and dapo, which are the same normaliser on one process (they differ across processes only)."""
    _, x, values, _ = _member_inputs("token-offpolicy-mask-kl", "mask-small-bf16", 5)
    losses = {}
    for member in MEMBERS[1:]:
        spec = find_spec(f"grpo/{member}")
        xm = {k: v for k, v in x.items() if spec.has_input(k)}
        if spec.has_input("sampling_ratio"):
            xm["sampling_ratio"] = torch.linspace(0.3, 4.0, x["old_logprobs"].numel()).view_as(x["old_logprobs"])
        losses[member] = reference_loss(xm, GrpoParameters.from_spec(spec, {**spec.parameter_values, "temperature": values["temperature"]}))
    assert losses["bnpo-mask"] == losses["dapo-mask"]
    del losses["dapo-mask"]
    # TRL's normaliser at its defaults (N >= P, accumulation factor 1) is dapo-global-mask's: the
    # declared case and the draws below N = P tell them apart (test_trl_dapo_normaliser_differs_below_p)
    assert losses["dapo-global-accum-mask"] == losses["dapo-global-mask"]
    del losses["dapo-global-accum-mask"]
    assert len({round(v, 12) for v in losses.values()}) == len(losses), losses


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask", "token-offpolicy-mask-kl"])
def test_masked_positions_get_exactly_zero_gradient_and_their_logits_do_not_matter(member):
    spec, x, values, p = _member_inputs(member, "mask-small-bf16", 3)
    keep = x["completion_mask"] != 0
    assert (~keep).any() and keep.any()
    ref = reference_gradient_dense(x, p)
    assert torch.equal(ref[:, :-1][~keep], torch.zeros_like(ref[:, :-1][~keep]))
    other = dict(x)
    other["logits"] = x["logits"].clone()
    other["logits"][:, :-1][~keep] = torch.randn(int((~keep).sum()), x["logits"].shape[-1]).to(x["logits"].dtype) * 30
    other["old_logprobs"] = torch.where(keep, x["old_logprobs"], x["old_logprobs"] + 7.0)
    assert reference_loss(other, p) == reference_loss(x, p)
    assert torch.equal(reference_gradient_dense(other, p)[:, :-1][keep], ref[:, :-1][keep])


@pytest.mark.parametrize("member", ["sequence-offpolicy-mask", "dapo-global-mask"])
def test_chunking_keeps_sequences_coupled(member):
    spec, x, values, p = _member_inputs(member, "mask-long", 4)
    vocab = x["logits"].shape[-1]
    small = list(chunked_gradient(x, p, 8 * 4 * vocab * 5))  # 5 rows a chunk: sequences split across chunks
    big = list(chunked_gradient(x, p))
    assert len(small) > len(big) == 1
    assert torch.equal(torch.cat([c.values for c in small]), big[0].values)
    assert chunked_loss(x, p, 8 * 4 * vocab * 5) == chunked_loss(x, p)
    scales = torch.cat([c.scale for c in small])
    assert torch.equal(scales, row_scales(x, p, x["logits"].shape[1]))
    assert (torch.cat([c.values for c in small]).abs().amax(-1) <= scales * (1 + 1e-12)).all()


def test_old_logprobs_fill_every_region_and_stay_away_from_the_boundaries():
    # the declared values (a draw can put 1 + epsilon_high next to delta: a region too thin to count in)
    values = dict(find_spec("grpo/token-offpolicy-mask-delta").parameter_values)
    spec, x, values, p = _member_inputs("token-offpolicy-mask-delta", "mask-long", 6, values)
    r = torch.exp(reference_logprobs(x, p) - x["old_logprobs"].double()).flatten()
    margin = spec.validation.member_inputs.boundary_margin
    knots = [1 - p.epsilon_low, 1 + p.epsilon_high, p.delta]
    for k in knots:
        assert (torch.abs(r / k - 1) > margin * 0.9).all(), k
    edges = [0.0] + sorted(knots) + [math.inf]
    for a, b in zip(edges, edges[1:]):
        assert ((r > a) & (r < b)).sum() >= 10, (a, b)
    assert len(ratio_intervals(p, spec.validation.member_inputs)) == 4


def test_sequence_ratios_fill_every_region():
    spec, x, values, p = _member_inputs("sequence-offpolicy-mask", "mask-long", 7)
    keep = (x["completion_mask"] != 0).double()
    lr = (reference_logprobs(x, p) - x["old_logprobs"].double()) * keep
    s = torch.exp(lr.sum(-1) / keep.sum(-1).clamp(min=1))
    rows = keep.sum(-1) > 0
    lo, hi = 1 - p.epsilon_low, 1 + p.epsilon_high
    assert ((s[rows] / lo - 1).abs() > 0.015).all() and ((s[rows] / hi - 1).abs() > 0.015).all()


def test_masks_have_every_layout_in_the_first_sets_in_the_workload_dtype():
    from grpo_conform.ops.grpo_logits.generators.masks import classify

    spec = find_spec("grpo/bnpo-mask")
    for workload, dtype in (("mask-small-bf16", torch.bool), ("mask-fp32", torch.int64), ("mask-long", torch.int32)):
        rw = spec.resolve(spec.workload(workload), random.Random(8))
        layouts = set()
        for case in range(3):  # batch 3 and 4: the edge rows in every set, the ordinary ones rotated over three
            mask = generate(spec, rw, 8 + case, "cpu", values=spec.parameter_values, case=case)["completion_mask"]
            assert mask.dtype == dtype and (mask != 0).any()
            layouts |= set(classify(mask != 0))
        assert {"right", "left", "holes", "single", "full", "empty"} <= layouts, (workload, layouts)


# -- ties (docs/architecture.md s. 2: the unclipped branch is active at an exact tie) ----------------
@pytest.mark.parametrize("member", ["token-is", "token-offpolicy-mask", "sequence-offpolicy-mask", "dr-grpo-mask",
                                    "vllm-is-mask"])
def test_exact_ties_keep_the_full_gradient_in_float32_and_in_the_reference(member):
    # the validator's exact-ties probe: every token ties in a float32 kernel's arithmetic and in the reference's
    workload = "small-bf16" if member == "token-is" else "mask-small-bf16"
    spec, x, values, _ = _member_inputs(member, workload, 9)
    tx, tvalues = exact_tie_inputs(spec, x, values, 9)
    p = GrpoParameters.from_spec(spec, tvalues)
    assert p.epsilon_low == 0.0 and 0.0 <= p.epsilon_high < 1e-8
    if "old_logprobs" in tx:
        keep = tx["completion_mask"] != 0
        for dtype in (torch.float32, torch.bfloat16, torch.float16):  # logp - old is exactly 0 in float32: r = 1
            z = tx["logits"][:, :-1].to(dtype).float() / p.temperature
            lp = torch.log_softmax(z, -1).gather(-1, tx["completion_ids"].unsqueeze(-1)).squeeze(-1)
            assert torch.equal(lp[keep], tx["old_logprobs"][keep])
        r = torch.exp(reference_logprobs(tx, p) - tx["old_logprobs"].double())[keep]
        if member != "sequence-offpolicy-mask":
            assert (r == 1 + p.epsilon_high).all()  # on the upper bound exactly, as the reference sees it
    loss, grad = autograd_loss(tx, p)
    ref = reference_gradient_dense(tx, p)
    _assert_close(grad, ref)
    # the full gradient: the same as a wide clip (no tie at all) would give
    wide = GrpoParameters.from_spec(spec, {**tvalues, "epsilon_low": 0.5, "epsilon_high": 0.5})
    assert torch.allclose(ref, reference_gradient_dense(tx, wide), rtol=1e-14, atol=0)
    # and far from zero where a token has weight: the clipped branch (zero) is far outside any tolerance
    scales = row_scales(tx, p).view(ref.shape[0], ref.shape[1])
    rows = ref.abs().amax(-1)
    live = scales > 0
    if "old_logprobs" in tx:  # tie rows: p = 1/2 at the target, so every live row holds half its scale
        assert live.any() and (rows[live] >= 0.2 * scales[live]).all()
    else:  # on-policy: the workload's own logits (some rows near one-hot)
        assert float(rows.max()) >= 0.2 * float(scales.max()) > 0


@pytest.mark.parametrize("side", ["high", "low"])
@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask"])
def test_ties_at_nonzero_epsilon_take_the_unclipped_branch(side, member):
    spec, x, values, _ = _member_inputs(member, "mask-small-bf16", 10)
    tx, tvalues = boundary_tie(x, values, side, 10)
    p = GrpoParameters.from_spec(spec, tvalues)
    r = torch.exp(reference_logprobs(tx, p) - tx["old_logprobs"].double())
    bound = 1 + p.epsilon_high if side == "high" else 1 - p.epsilon_low
    assert (r == bound).all()  # exact, as the reference sees it
    loss, grad = autograd_loss(tx, p)
    ref = reference_gradient_dense(tx, p)
    _assert_close(grad, ref)
    # at the tie every token with weight passes -A*r: rows with A of either sign are non-zero
    keep = tx["completion_mask"] != 0
    rows = ref[:, :-1].abs().amax(-1)
    assert (rows[keep & (tx["advantages"][:, None] != 0)] > 0).all()
    # the other way (clipped at a tie) would zero them: nudging r past the bound does
    nudged = dict(tx)
    step = -1e-6 if side == "high" else 1e-6
    nudged["old_logprobs"] = tx["old_logprobs"] + step
    moved = reference_gradient_dense(nudged, p)[:, :-1].abs().amax(-1)
    adv = tx["advantages"][:, None].expand_as(keep)
    clipped_side = adv > 0 if side == "high" else adv < 0
    assert (moved[keep & clipped_side] == 0).all() and (keep & clipped_side).any()


def test_kl_inputs_do_not_cancel_and_the_row_scale_bounds_every_element():
    """ref_logprobs are drawn so the KL term adds to the policy term; where terms do cancel
    (hand-made here), the row scale stays the sum of their magnitudes, not the small difference."""
    from grpo_conform.ops.grpo_terms import token_terms

    spec, x, values, p = _member_inputs("token-offpolicy-mask-kl", "mask-small-bf16", 11)
    logp = reference_logprobs(x, p)
    d = x["ref_logprobs"].double() - logp
    adv = x["advantages"].double()[:, None].expand_as(d)
    assert ((d.abs() >= 0.6 - 1e-6) & (d.abs() <= 1.2 + 1e-6)).all()
    assert (torch.sign(d)[adv != 0] == torch.sign(adv)[adv != 0]).all()
    terms = token_terms(x, p, logp)
    keep = x["completion_mask"] != 0
    # no cancellation: the scale (KL counted as beta*(1 + e^d)) is within (1 + e^0.6)/(e^0.6 - 1) = 3.43 of |dL/dlogp|
    assert (terms.scale[keep] <= 3.5 * terms.dlogp.abs()[keep]).all()
    flipped = dict(x)
    flipped["ref_logprobs"] = (logp - d).float()  # KL against the policy term: they cancel partly
    t2 = token_terms(flipped, p, logp)
    assert (t2.scale >= t2.dlogp.abs()).all() and (t2.scale[keep] > t2.dlogp.abs()[keep] * 1.01).any()
    grad = reference_gradient_dense(flipped, p)[:, :-1]
    assert (grad.abs().amax(-1) <= t2.scale / p.temperature * (1 + 1e-12)).all()


# -- far ratios (the validator's far-ratios probe) --------------------------------------------------------
@pytest.mark.parametrize("member", ["token-offpolicy-mask", "sequence-offpolicy-mask", "cispo-mask",
                                    "token-offpolicy-mask-delta", "vllm-is-mask"])
def test_far_ratios_lie_far_outside_the_clip_and_away_from_every_boundary(member):
    spec, x, values, p = _member_inputs(member, "mask-small-bf16", 4)
    x["advantages"] = x["advantages"].abs() + 0.1  # one sign only: the probe must make both
    fx = far_ratio_inputs(spec, x, values, 4)
    changed = ("old_logprobs", "advantages", "completion_mask")
    assert set(fx) == set(x) and all(torch.equal(fx[k], x[k]) for k in x if k not in changed)
    was_empty = (x["completion_mask"] == 0).all(-1)  # an empty row gets one token live, nothing else moves
    moved = fx["completion_mask"] != x["completion_mask"]
    assert not moved[~was_empty].any() and (moved[was_empty].sum(-1) == 1).all()
    assert torch.equal(fx["advantages"].abs(), x["advantages"].abs()) and (fx["advantages"] < 0).sum() == 1
    keep = fx["completion_mask"] != 0
    log_r = (reference_logprobs(fx, p) - fx["old_logprobs"].double())
    adv = fx["advantages"].double()[:, None].expand_as(log_r)
    if member.startswith("sequence"):
        m = keep.double()
        log_r = ((log_r * m).sum(-1) / m.sum(-1).clamp_min(1.0))[keep.any(-1)]
        adv = fx["advantages"].double()[keep.any(-1)]
    else:
        log_r, adv = log_r[keep], adv[keep]
    r = torch.exp(log_r)
    # far out on the unclipped side of each token (float32 rounding of old aside): high for A < 0, low for A > 0
    assert (r[adv < 0] >= 2.9).all() and (r[adv > 0] <= 0.31).all(), (r, adv)
    assert (adv < 0).any() and (adv > 0).any()  # both tails
    knots = [p.epsilon_high] if p.loss_type == "cispo" else [1 - p.epsilon_low, 1 + p.epsilon_high]
    knots += [p.delta] if p.delta is not None else []
    for k in knots:  # never a tie (a boundary inside the far range is cut out with a margin)
        assert ((r - k).abs() > 0.01 * k).all(), (k, r)
    # the gradient there is the reference's, far from zero where A < 0 and r > 3 (a dual clip's zeros)
    ref = reference_gradient_dense(fx, p)
    assert float(ref.abs().max()) > 0


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_vespo_rows_put_one_token_past_the_token_clamp_and_the_sum_near_phi_s_peak(seed):
    """W-vespo: without the per-token clamp the row's sum moves 2-5 and phi with it (gallery
    vespo-token-clamp-dropped); with it the clamped sum sits within 0.5 of log(k / lambda)."""
    from grpo_conform.ops.grpo_logits.generators.logprob_gaps import vespo_clamp_inputs
    from grpo_conform.ops.grpo_terms import vespo_weight

    spec, x, values, p = _member_inputs("vespo-mask", "mask-small-bf16", seed)
    x["completion_mask"][0] = 1  # at least one row with three kept tokens
    covered = {}
    fx = vespo_clamp_inputs(spec, x, values, seed, covered)
    assert all(torch.equal(fx[k], x[k]) for k in x if k != "old_logprobs") and covered["rows"] >= 1
    keep = fx["completion_mask"] != 0
    log_r = torch.where(keep, reference_logprobs(fx, p) - fx["old_logprobs"].double(), torch.zeros(()))
    adv = fx["advantages"].double()
    m = keep.double()
    for b in range(keep.shape[0]):
        if int(keep[b].sum()) < 3:
            assert float(log_r[b].abs().max()) < 1e-5  # ratio 1
            continue
        far = log_r[b].abs() > 20.0
        assert int(far.sum()) == 1 and 21.9 < float(log_r[b][far].abs()) < 25.1
        assert (log_r[b][keep[b] & ~far] * log_r[b][far].sign() < 0).all()  # the others on the other side
        clamped = float(log_r[b].clamp(-20, 20).sum())
        k, lam = (p.vespo_k_pos, p.vespo_lambda_pos) if adv[b] >= 0 else (p.vespo_k_neg, p.vespo_lambda_neg)
        assert abs(clamped - math.log(k / lam)) < 0.5 + 1e-4
        assert 2.0 - 1e-4 < abs(float(log_r[b].sum()) - clamped) < 5.0 + 1e-4
    phi = vespo_weight(log_r, m, adv[:, None], p)[:, 0]
    unclamped = vespo_weight(_sum_only(log_r, m), m, adv[:, None], p)[:, 0]
    live = keep.sum(-1) >= 3
    assert ((phi[live] - unclamped[live]).abs() > 0.2 * phi[live].abs()).all()


def _sum_only(log_r, m):
    """Rows whose first kept token carries the whole unclamped sum (cut at 20, as the sum's clamp would), the
    others 0: what phi is for a kernel that clamps only the sum (the gallery folder)."""
    out = torch.zeros_like(log_r)
    first = m.argmax(-1)
    out[torch.arange(m.shape[0]), first] = (log_r * m).sum(-1).clamp(max=20.0)
    return out


# -- TRL 1.16 defaults (issue 33): bias-corrected KL, the vLLM modes, TRL's dapo normaliser ---------------
def test_trl_dapo_normaliser_differs_below_p_and_with_the_accumulation_factor():
    spec, x, values, _ = _member_inputs("dapo-global-accum-mask", "mask-small-bf16", 11)
    base = {**values, "num_processes": 8, "gradient_accumulation_steps": 1, "steps_per_generation": 1}
    trl = GrpoParameters.from_spec(spec, {**base, "num_items_in_batch": 3})
    ours = GrpoParameters.from_spec(find_spec("grpo/dapo-global-mask"), {**base, "num_items_in_batch": 3})
    # max(1, 3) / 8 = 0.375 against max(1, 3 / 8) = 1
    assert reference_loss(x, trl) == pytest.approx(reference_loss(x, ours) / 0.375, rel=1e-12)
    factor = GrpoParameters.from_spec(spec, {**base, "num_items_in_batch": 64, "gradient_accumulation_steps": 4,
                                             "steps_per_generation": 2})
    plain = GrpoParameters.from_spec(spec, {**base, "num_items_in_batch": 64})
    assert reference_loss(x, factor) == pytest.approx(reference_loss(x, plain) / 2, rel=1e-12)
    # the draws reach N < P (the member's draw range for N is [1, 48])
    draws = [draw_parameters(spec, random.Random(s)) for s in range(300)]
    assert sum(d["num_items_in_batch"] < d["num_processes"] for d in draws) >= 5


def test_bias_corrected_kl_differs_on_policy_and_has_the_closed_form():
    """TRL 1.16's k3 * ratio: even at r = 1 its gradient is beta * (logp - ref), not beta * (1 - e^(ref - logp))."""
    spec, x, values, p = _member_inputs("token-offpolicy-mask-kl-bc", "mask-small-bf16", 12)
    on = dict(x)
    on["old_logprobs"] = reference_logprobs(x, p).float()  # r = 1 to fp32 rounding
    on["advantages"] = torch.zeros_like(x["advantages"])  # the KL terms alone
    bc = reference_gradient_dense(on, p)
    plain = reference_gradient_dense(on, GrpoParameters.from_spec(find_spec("grpo/token-offpolicy-mask-kl"), values))
    assert float((bc - plain).norm()) > 0.2 * float(plain.norm())  # refs 0.6 to 1.2 nats away
    loss, grad = autograd_loss(on, p)
    _assert_close(grad, bc)


@pytest.mark.parametrize("member", ["vllm-sequence-truncate", "vllm-sequence-mask"])
def test_sequence_sampling_ratios_straddle_the_cap(member):
    spec, x, values, p = _member_inputs(member, "mask-long", 13)
    keep = x["completion_mask"] != 0
    q = torch.exp(torch.where(keep, torch.log(x["sampling_ratio"].double()), torch.zeros(1, dtype=torch.float64)).sum(-1))
    rows = keep.any(-1)
    cap = p.sampling_ratio_cap
    assert ((q[rows] / cap - 1).abs() > 0.015).all()
    assert (q[rows] > cap).any() and (q[rows] < cap).any()
    per_token = x["sampling_ratio"][keep].double()
    assert float(per_token.max()) < cap  # a token-level mode would keep every token: the modes differ
    token = GrpoParameters.from_spec(find_spec("grpo/vllm-is-mask"), {k: v for k, v in values.items()
                                                                      if k != "vllm_importance_sampling_mode"})
    assert reference_loss(x, token) != pytest.approx(reference_loss(x, p), rel=1e-3)
