"""Cross-check of the float64 reference against verl's own policy loss and aggregation, imported
(verl.trainer.ppo.core_algos: compute_policy_loss_vanilla + agg_loss), never copied. Skipped
when verl is not installed (it pulls ray and more: not part of the base install; see
docs/spec-family.md "Trainer cross-check and trainer adapter").

Where verl's semantics differ from the members' (which follow TRL and Liger), the test says so
instead of hiding it: verl's seq-mean modes average over the sequences that have at least one
token (a fully masked row is not counted in the batch), TRL's grpo and dr_grpo divide by the
whole batch; verl clamps the log-ratio to +-20 and applies the dual clip c = 3 for A < 0
(ratios here stay below 3, so neither acts).
"""

from __future__ import annotations

import random

import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")

from grpo_conform.ops.grpo_logits.inputs import generate  # noqa: E402
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss  # noqa: E402
from grpo_conform.spec import draw_parameters, find_spec  # noqa: E402


class _ActorConfig(dict):
    """The few fields compute_policy_loss_vanilla reads from verl's ActorConfig."""

    def __init__(self, eps_low: float, eps_high: float):
        super().__init__(clip_ratio_c=3.0)
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high = eps_low, eps_low, eps_high
        self.global_batch_info = {}


def _verl(x, p, mode, scale_factor=None):
    leaf = x["logits"].detach().to(torch.float64).requires_grad_(True)
    ids = x["completion_ids"]
    seq = ids.shape[1]
    logp = torch.log_softmax(leaf[:, :seq] / p.temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    mask = (x["completion_mask"] != 0).to(torch.float64)
    adv = x["advantages"].to(torch.float64)[:, None].expand_as(logp)
    config = _ActorConfig(p.epsilon_low, p.epsilon_high)
    if scale_factor is not None:
        config.global_batch_info = {"loss_scale_factor": scale_factor}
    loss, _ = core_algos.compute_policy_loss_vanilla(x["old_logprobs"].to(torch.float64), logp, adv, mask,
                                                     loss_agg_mode=mode, config=config)
    loss.backward()
    return float(loss.detach()), leaf.grad, mask


@pytest.mark.parametrize("member, mode", [("bnpo-mask", "token-mean"), ("token-offpolicy-mask", "seq-mean-token-mean"),
                                          ("dr-grpo-mask", "seq-mean-token-sum-norm")])
def test_reference_agrees_with_verl(member, mode):
    spec = find_spec(f"grpo/{member}")
    rw = spec.resolve(spec.workload("mask-small-bf16"), random.Random(0))
    values = draw_parameters(spec, random.Random(0))
    x = generate(spec, rw, 0, "cpu", values=values).tensors
    p = GrpoParameters.from_spec(spec, values)
    scale = p.max_completion_length if member == "dr-grpo-mask" else None
    loss, grad, mask = _verl(x, p, mode, scale)
    batch = mask.shape[0]
    nonempty = int((mask.sum(-1) > 0).sum())
    factor = 1.0 if mode == "token-mean" else nonempty / batch  # verl: mean over non-empty sequences
    assert reference_loss(x, p) == pytest.approx(loss * factor, rel=1e-7, abs=1e-12)  # verl divides by n + 1e-8
    ref = reference_gradient_dense(x, p)
    assert float((grad * factor - ref).norm()) <= 1e-7 * float(ref.norm())
