import torch

CLIP_RATIO_C = 3.0  # PPO's dual clip as verl's compute_policy_loss_vanilla defaults it (clip_ratio_c)


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # The member's clipped surrogate plus a dual clip it does not declare: for a negative advantage
    # the token loss is capped at -A * 3, so a ratio above 3 gets no gradient where the member passes
    # -A * r. The drawn ratios of the member's workloads stay below ~1.9 (they straddle the clip
    # boundaries), so loss and gradient match there; only ratios far above the clip show it.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    surrogate = torch.where(clipped <= unclipped, unclipped, clipped)  # max of the two losses; ties: unclipped
    dual = torch.minimum(surrogate, -adv * CLIP_RATIO_C)
    per_token = torch.where(adv < 0, dual, surrogate)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
