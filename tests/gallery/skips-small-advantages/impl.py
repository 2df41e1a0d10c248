import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    keep = (a.abs() >= 0.04).float()  # "negligible" sequences skipped: their gradient is lost
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    loss = (per_token * keep + per_token.detach() * (1 - keep)).sum(-1) / seq
    return loss.mean()
