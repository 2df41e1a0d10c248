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


class _InPlace(torch.autograd.Function):
    """Like Liger's GrpoLossFunction with inplace=True: the gradient overwrites the logits."""

    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        loss, g = closed_form(logits, ids, adv, temperature)
        ctx.save_for_backward(logits)
        ctx.g = g
        return loss

    @staticmethod
    def backward(ctx, d):
        (logits,) = ctx.saved_tensors
        out = logits.data
        seq = ctx.g.shape[1]
        out[:, :seq] = (d * ctx.g).to(out.dtype)
        out[:, seq:] = 0
        return out, None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _InPlace.apply(logits, completion_ids, advantages, temperature)
