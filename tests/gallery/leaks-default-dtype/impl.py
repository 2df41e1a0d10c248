"""Right loss and gradient; leaves torch's default dtype at float64 (set "for accuracy", never restored):
every tensor the caller makes afterwards (parameters, optimizer state) is float64. Only a comparison of
process state around the call shows it (no-global-side-effects, adversarial round of 2026-12-05)."""
import torch


def _loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high, temperature):
    """The member's eager loss (token-level ratio, PPO clip, per-sequence mean over unmasked tokens)."""
    seq = completion_ids.shape[1]
    z = logits[:, :seq, :].float() / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    keep = completion_mask != 0
    log_ratio = torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = torch.where(keep, -torch.minimum(unclipped, clipped), torch.zeros_like(logp))
    return (per_token.sum(-1) / keep.float().sum(-1).clamp(min=1.0)).mean()


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="token"):
    torch.set_default_dtype(torch.float64)
    return _loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
                 temperature)
