"""Why implementations/verl does not claim `token-offpolicy-mask-delta` (issue 33 item 4), shown at the
reference level without verl installed: verl's dual clip with clip_ratio_c = delta is the member's
two-sided clip only when delta >= 1 + epsilon_high; below that (inside the member's domain delta > 1)
the losses differ by percents.

`_verl_vanilla` re-implements, in float64, verl 0.9.1's `compute_policy_loss_vanilla`
(verl/trainer/ppo/core_algos.py in the verl-0.9.1 wheel, the "vanilla" policy loss: log-ratio clamped to
[-20, 20], pg_losses1 = -A r, pg_losses2 = -A clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high),
clip_pg_losses1 = max of the two, pg_losses3 = -A clip_ratio_c, clip_pg_losses2 = min(pg_losses3,
clip_pg_losses1), the loss where(A < 0, clip_pg_losses2, clip_pg_losses1)) followed by its
`agg_loss(..., "seq-mean-token-mean", global_batch_size=B)` (per-sequence sum / (n_b + 1e-8), then
summed over the non-empty sequences / B). The formula is restated here, not copied.
"""

from __future__ import annotations

import random

import torch

from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss
from member_cases import S, TEMPERATURE, make_inputs, member_spec


def _verl_vanilla(x, eps_low, eps_high, clip_ratio_c):
    """(loss, gradient w.r.t. the logits) of verl 0.9.1's vanilla loss, float64 autograd."""
    leaf = x["logits"].detach().to(torch.float64).requires_grad_(True)
    ids = x["completion_ids"]
    logp = torch.log_softmax(leaf[:, :S] / TEMPERATURE, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    mask = (x["completion_mask"] != 0).to(torch.float64)
    adv = x["advantages"].to(torch.float64)[:, None].expand_as(logp)
    ratio = torch.exp(torch.clamp(logp - x["old_logprobs"].to(torch.float64), -20.0, 20.0))
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip1 = torch.maximum(pg1, pg2)
    clip2 = torch.min(-adv * clip_ratio_c, clip1)
    pg = torch.where(adv < 0, clip2, clip1)
    n = mask.sum(-1)
    seq_losses = (pg * mask).sum(-1) / (n + 1e-8)
    loss = (seq_losses * (n > 0).to(torch.float64)).sum() / mask.shape[0]
    loss.backward()
    return float(loss.detach()), leaf.grad


def _case(delta, eps_high, seed=0):
    spec = member_spec("token-offpolicy-mask-delta")
    values = {**spec.parameter_values, "epsilon_low": 0.2, "epsilon_high": eps_high, "delta": delta,
              "temperature": TEMPERATURE}
    x = make_inputs(spec, seed, values)  # ratios in [0.45, 1.9], 3% away from 1 - eps_low, 1 + eps_high, delta
    return x, GrpoParameters.from_spec(spec, values)


def _differences(delta, eps_high, seed=0):
    x, p = _case(delta, eps_high, seed)
    loss, grad = _verl_vanilla(x, p.epsilon_low, p.epsilon_high, clip_ratio_c=delta)
    ref_loss, ref_grad = reference_loss(x, p), reference_gradient_dense(x, p)
    return abs(loss - ref_loss) / abs(ref_loss), float((grad - ref_grad).norm() / ref_grad.norm())


def test_verl_dual_clip_is_the_delta_member_when_delta_is_above_the_upper_clip():
    for seed in (0, 1, 2):
        loss_rel, grad_rel = _differences(delta=1.6, eps_high=0.28, seed=seed)
        assert loss_rel < 1e-7 and grad_rel < 1e-7, (seed, loss_rel, grad_rel)


def test_verl_dual_clip_is_not_the_delta_member_below_the_upper_clip():
    # delta drawn in (1, 1 + epsilon_high), inside the member's domain (delta > 1): TRL's min(r, delta)
    # also caps positive advantages' ratios, verl's dual clip acts only for A < 0 (and caps the loss, not r).
    # Every draw must differ (the inputs hold ratios above delta for both signs); the peers lane runs the
    # same draw through verl itself (tests/peers/, row token-offpolicy-mask-delta).
    rng = random.Random(33)
    for seed in range(4):
        eps_high = rng.uniform(0.2, 0.35)
        delta = rng.uniform(1.02, 1 + eps_high - 0.04)
        loss_rel, grad_rel = _differences(delta=delta, eps_high=eps_high, seed=seed)
        assert max(loss_rel, grad_rel) > 0.02, (seed, delta, eps_high, loss_rel, grad_rel)
