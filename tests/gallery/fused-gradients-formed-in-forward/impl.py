"""Passes: the fused design of implementations/triton-fused, in eager PyTorch. Forward forms every gradient
at a predicted upstream scalar (the last backward's, 1 at first, in float16 at least 1 in magnitude; Liger's
path uses 1) with autograd inside forward, kept in the operands' dtype; backward multiplies them by the real
upstream over the predicted one. In float16 what lies below the range at the predicted scalar is gone whatever
the real one: folded at 1, the upstream probe's large scalar (other-dtypes' float16 calls) found d weight
elements 90% off against floors of upstream c. The fused operation forms its gradients in forward by design,
so its absolute floors are those of the gradient at upstream 1, scaled with it
(`GemmAllowance.formed_before_upstream`), and it is not judged at a loss scale (`Operation.loss_scaled`):
docs/checks.md, "float16 and the other declared dtypes". This folder must pass (without the allowance it
failed 1 of 2 runs); the logits operation has neither allowance (gallery other-dtypes-fp16-loss-scale)."""

import torch
import torch.nn.functional as F


def _loss(hidden, weight, bias, completion_ids, advantages, epsilon_low, epsilon_high, temperature, old_logprobs,
          completion_mask, loss_type):
    logits = F.linear(hidden, weight, bias)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    keep = torch.ones_like(logp, dtype=torch.bool) if completion_mask is None else completion_mask != 0
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    ratio = torch.exp(logp - old)
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(unclipped <= clipped, unclipped, clipped)
    m = keep.to(torch.float32)
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    raise ValueError(f"loss_type {loss_type!r} is not implemented here")


#: the upstream scalar the next forward folds in, per dtype as triton-fused's plans hold it (one shared across
#: dtypes folded a bfloat16 call's 5e-4 into the next float16 call: reach's low calls, forty-second session)
_PREDICTED: dict = {}


class _FormedInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, args):
        ctx.predicted = _PREDICTED.get(hidden.dtype, 1.0)
        with torch.enable_grad():
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            loss = _loss(h, w, None, *args)
            gh, gw = torch.autograd.grad(loss * ctx.predicted, (h, w))
        ctx.save_for_backward(gh, gw)
        return loss.detach()

    @staticmethod
    def backward(ctx, upstream):
        gh, gw = ctx.saved_tensors
        c = float(upstream)
        if c != 0.0 and c == c:  # in float16 at least 1 in magnitude, as triton-fused's FusedPlan.observe
            _PREDICTED[gh.dtype] = c if gh.dtype != torch.float16 or abs(c) >= 1 else (1.0 if c > 0 else -1.0)
        k = c / ctx.predicted
        return (gh.float() * k).to(gh.dtype), (gw.float() * k).to(gw.dtype), None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    old_logprobs=None, completion_mask=None, loss_type="grpo", **declared_defaults):
    if declared_defaults.get("importance_sampling_level", "token") != "token" or declared_defaults.get("beta", 0.0):
        raise ValueError(f"only the token-level member without KL is implemented here: {declared_defaults}")
    args = (completion_ids, advantages, epsilon_low, epsilon_high, temperature, old_logprobs, completion_mask,
            loss_type)
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        return _loss(hidden, weight, None, *args)
    return _FormedInForward.apply(hidden, weight, args)
