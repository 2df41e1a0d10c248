import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # The clip as a hand-written kernel states it: a token is clipped where its ratio has reached
    # the bound on the side its advantage pushes to, and a clipped token gets no gradient. The
    # comparisons are `>=` / `<=`, so a ratio exactly at 1 - epsilon_low or 1 + epsilon_high (and
    # every ratio of 1 when epsilon is 0) counts as clipped: the loss value is the same either way
    # (both branches are equal there), the gradient is zero where the spec (TRL, verl, Liger) passes
    # the full -A*r. Random ratios never tie, so only inputs built to tie show it.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    lo, hi = 1.0 - epsilon_low, 1.0 + epsilon_high
    is_clipped = ((adv > 0) & (ratio >= hi)) | ((adv < 0) & (ratio <= lo))
    bound = torch.clamp(ratio, lo, hi).detach()
    per_token = -torch.where(is_clipped, bound * adv, ratio * adv)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
