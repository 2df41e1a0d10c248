import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / max(temperature, 0.4)  # "for numerical stability"
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean()
