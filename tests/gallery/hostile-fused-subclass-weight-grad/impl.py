"""Hostile output (fused lm_head): backward returns the right weight gradient as a tensor subclass.
`.grad` accumulation makes it a plain tensor, but torch.autograd.grad hands the caller the subclass itself.
Before 2026-12-03 this was CONFORMANT; now the checks judged on autograd.grad calls report it."""
import torch


class LazyGrad(torch.Tensor):
    """Stands in for a lazy gradient: a caller of torch.autograd.grad gets this type back."""


def _eager(hidden, weight, ids, adv, temperature):
    logits = torch.nn.functional.linear(hidden, weight)
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    return (-(ratio * adv.float().unsqueeze(-1))).mean(-1).mean()


class F(torch.autograd.Function):
    """The right gradients; the weight's handed back as a LazyGrad."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, adv, temperature):
        with torch.enable_grad():
            h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)
            gh, gw = torch.autograd.grad(_eager(h, w, ids, adv, temperature), (h, w))
            loss = _eager(hidden.detach(), weight.detach(), ids, adv, temperature)
        ctx.save_for_backward(gh, gw)
        return loss

    @staticmethod
    def backward(ctx, up):
        gh, gw = ctx.saved_tensors
        gh, gw = (gh * up).to(gh.dtype), (gw * up).to(gw.dtype)
        return gh, gw.as_subclass(LazyGrad), None, None, None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    if torch.is_inference_mode_enabled() or not torch.is_grad_enabled():
        return _eager(hidden, weight, completion_ids, advantages, temperature)
    return F.apply(hidden, weight, completion_ids, advantages, temperature)
