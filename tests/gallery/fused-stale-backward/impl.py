"""Cheat: "backward only accumulates". Forward computes every gradient itself (as Liger's fused
path does) but keeps the first call's in a module-level cache; backward hands those back scaled by
the upstream gradient, whatever the inputs of the call were. The first call is right; a second call
with other inputs gets stale gradients (what a benchmark that times one backward never sees)."""
import torch

def _loss(logp, advantages):
    """token-is: ratio exp(logp - logp.detach()) = 1 carrying the gradient; mean over tokens, then batch."""
    ratio = torch.exp(logp - logp.detach())
    adv = advantages.float().unsqueeze(-1)
    per_token = -(ratio * adv)  # r = 1 exactly: the clip is never active
    return per_token.mean(-1).mean()


_CACHE = {}


def _grads(hidden, weight, completion_ids, advantages, temperature):
    with torch.enable_grad():
        h = hidden.detach().requires_grad_(True)
        w = weight.detach().requires_grad_(True)
        logits = torch.nn.functional.linear(h, w)
        logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        loss = _loss(logp, advantages)
        gh, gw = torch.autograd.grad(loss, (h, w))
    return loss.detach(), gh, gw


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, completion_ids, advantages, temperature):
        loss, gh, gw = _grads(hidden, weight, completion_ids, advantages, temperature)
        if "grads" not in _CACHE:
            _CACHE["grads"] = (gh, gw)
        ctx.grads = _CACHE["grads"]
        return loss

    @staticmethod
    def backward(ctx, g):
        gh, gw = ctx.grads
        return gh * g, gw * g, None, None, None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    if _CACHE.get("grads") is not None and _CACHE["grads"][0].shape != hidden.shape:
        _CACHE.clear()  # a new shape: start over (the cheat stays stale only within a shape)
    return _Fused.apply(hidden, weight, completion_ids, advantages, temperature)
