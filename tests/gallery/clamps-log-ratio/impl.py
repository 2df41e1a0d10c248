import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # The log-ratio clamped to [-20, 20] "against overflow": e^20 = 4.9e8 is nowhere near float32's
    # range, and the member's ratio is unclamped, so a token at r = e^23 with A < 0 gets e^20 times
    # the gradient instead of e^23 times, and a clamped ratio no gradient at all.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    log_ratio = torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp))
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    adv = advantages.float().unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = torch.where(clipped <= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
