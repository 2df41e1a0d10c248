"""Hostile output: backward returns the right gradient as a tensor subclass. `.grad` accumulation makes it a
plain tensor, but torch.autograd.grad hands the caller the subclass itself, whose methods could do anything.
Before 2026-12-03 this was CONFORMANT (the contract check judges backward calls only); now every check judged
against the reference on an autograd.grad call reports it."""
import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


class LazyGrad(torch.Tensor):
    """Stands in for a lazy gradient: a caller of torch.autograd.grad gets this type back."""


class _Sub(torch.autograd.Function):
    """The right gradient, returned from backward as a LazyGrad."""

    @staticmethod
    def forward(ctx, logits, ids, adv, eps_lo, eps_hi, temperature):
        with torch.enable_grad():
            x = logits.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(_eager(x, ids, adv, eps_lo, eps_hi, temperature), x)
        ctx.save_for_backward(g)
        return _eager(logits.detach(), ids, adv, eps_lo, eps_hi, temperature)

    @staticmethod
    def backward(ctx, upstream):
        (g,) = ctx.saved_tensors
        return (g * upstream).to(g.dtype).as_subclass(LazyGrad), None, None, None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    if torch.is_inference_mode_enabled() or not torch.is_grad_enabled():
        return _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
    return _Sub.apply(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
