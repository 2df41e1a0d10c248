import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # The clipped surrogate of grpo, then each token's loss times its sequence's length n_b, averaged
    # over all B * S positions: with no padding n_b = S and this is sum_t l / B, the member's loss.
    batch, seq = completion_ids.shape
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = -torch.where(clipped * adv >= ratio * adv, ratio * adv, clipped * adv)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token * m.sum(-1, keepdim=True)).sum() / (batch * seq)
