"""Drops a token whose vLLM sampling ratio equals the cap (q >= cap -> 0); the spec keeps it (q <= cap). The
generator kept every ratio 2% away from the cap and the member declares no tie case, so no call had a tie
until the round of 2026-12-05: now a float32-exact cap (TRL's 3.0, the ends of its range) puts some tokens
exactly on it. Otherwise the eager code `grpo-conform init` writes for the member."""

import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs=None, completion_mask=None, sampling_ratio=None, epsilon_low=0.2, epsilon_high=0.2, temperature=1.0, loss_type='grpo', importance_sampling_level='token', sampling_ratio_cap=3.0, vllm_importance_sampling_mode='token_mask'):
    if str(loss_type).replace('-', '_') != 'grpo':
        raise ValueError(f"this implementation does loss_type='grpo' only, got {loss_type!r}")
    if str(importance_sampling_level).replace('-', '_') != 'token':
        raise ValueError(f"this implementation does importance_sampling_level='token' only, got {importance_sampling_level!r}")
    # 1. Log-probabilities of the sampled tokens. logits has seq + 1 rows per sequence: the last
    #    one (the token after the completion) is never read, and its gradient must be exactly 0.
    seq = completion_ids.shape[1]
    z = logits[:, :seq, :].float() / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    # 2. The mask (bool or integer): masked positions contribute nothing and get a zero gradient.
    if completion_mask is None:
        keep = torch.ones_like(logp, dtype=torch.bool)
    else:
        keep = completion_mask != 0
    m = keep.float()
    # 3. The log-ratio against the behaviour policy; 0 at masked positions, so nothing there can
    #    overflow in exp or reach the gradient.
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    log_ratio = torch.where(keep, logp - old, torch.zeros_like(logp))
    # 4. Token-level importance ratio.
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)
    # 5. Clipped surrogate. At an exact tie of the two branches the unclipped one is active (its
    #    gradient passes): torch.where on >= says so instead of relying on torch.minimum's split.
    coef_1 = ratio
    coef_2 = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    unclipped, clipped = coef_1 * adv, coef_2 * adv
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    # 6. Sampling correction (vLLM importance sampling, TRL's token_mask).
    rho = sampling_ratio.float()
    rho = torch.where(rho >= sampling_ratio_cap, torch.zeros_like(rho), rho)  # at or above the cap: 0 (keep only q < cap)
    per_token = per_token * rho
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    # 8. Reduction (grpo).
    # Mean over each sequence's kept tokens, then mean over sequences.
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
