"""Wrong only when the lm_head is frozen (LoRA, adapters: weight.requires_grad False). The kernel's
hidden-only backward path, written apart from the full one, forgets the 1/T of d logits, so d hidden
comes back T times too large. With hidden, weight and bias all requiring grad, as every call had until
the adversarial round of 2026-12-05, it is right; the frozen-inputs probe freezes the weight."""
import torch


def _loss(logp, advantages):
    """token-is: ratio exp(logp - logp.detach()) = 1 carrying the gradient; mean over tokens, then batch."""
    ratio = torch.exp(logp - logp.detach())
    per_token = -(ratio * advantages.float().unsqueeze(-1))
    return per_token.mean(-1).mean()


class _HiddenOnlyPath(torch.autograd.Function):
    """Identity on hidden; its backward is the hidden-only path's, used when the weight is frozen."""

    @staticmethod
    def forward(ctx, x, t, weight_frozen):
        ctx.t, ctx.frozen = t, weight_frozen
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (g * ctx.t if ctx.frozen else g), None, None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    h = _HiddenOnlyPath.apply(hidden, temperature, not weight.requires_grad)
    logits = torch.nn.functional.linear(h, weight)
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return _loss(logp, advantages)
