import torch


class _Loss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        b, s1, v = logits.shape
        seq = s1 - 1
        z = logits[:, :seq].float() / temperature
        lse = torch.logsumexp(z, -1)
        ctx.save_for_backward(logits, ids, adv, lse)
        ctx.temperature = temperature
        return (-adv.float()).mean()

    @staticmethod
    def backward(ctx, dloss):
        logits, ids, adv, lse = ctx.saved_tensors
        b, s1, v = logits.shape
        seq = s1 - 1
        z = logits[:, :seq].float() / ctx.temperature
        p = torch.exp(z - lse.unsqueeze(-1))
        p.scatter_add_(-1, ids.unsqueeze(-1), -torch.ones_like(p[..., :1]))
        coef = adv.float().view(b, 1, 1) / (b * seq * ctx.temperature)
        grad = torch.zeros_like(logits)
        grad[:, :seq] = (dloss * coef * p).to(logits.dtype)
        return grad, None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # On-policy, the ratio is 1 and the unclipped branch is active for either sign of A.
    return _Loss.apply(logits, completion_ids, advantages, temperature)
