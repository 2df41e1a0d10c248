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
    # A vectorisation bug: the log-sum-exp is taken over two neighbouring rows at once.
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    b, s, v = z.shape
    flat = z.reshape(b * s, v)
    pair = torch.logsumexp(torch.stack([flat, flat.roll(1, 0)], 0), dim=(0, 2)) - torch.log(torch.tensor(2.0))
    target = flat.gather(-1, completion_ids.reshape(-1, 1)).squeeze(-1)
    logp = (target - pair).reshape(b, s)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean()
