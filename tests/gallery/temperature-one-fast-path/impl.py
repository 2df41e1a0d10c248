import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # On-policy GRPO (the ratio is exactly 1), with a "fast path" when no temperature scaling is
    # needed. The fast path forgets the per-sequence mean: right at every drawn temperature, wrong by
    # a factor of the sequence length at temperature 1.0, the value most training runs use.
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float()
    if temperature != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    adv = advantages.float().unsqueeze(-1)
    coef_2 = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = -torch.minimum(ratio * adv, coef_2 * adv)
    if temperature == 1.0:
        return per_token.sum(-1).mean()
    return per_token.mean(-1).mean()
