import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature, z=None):
    seq = ids.shape[1]
    if z is None:
        z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # Value off by 0.01, gradient right.
    return _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature) + 0.01
