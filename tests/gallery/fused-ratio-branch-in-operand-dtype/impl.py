"""The eager fused baseline with one change: the clip branch of the backward is decided on the ratio as it
would be saved for backward in the operands' dtype (a memory saving), not in float32. In bf16 the ratio
moves by up to 0.33% near 1.2, so tokens a hair from a clip bound take the wrong branch; the drawn ratios
keep 2% from every bound, so only near ties show it (the fused twin of `ratio-saved-in-logits-dtype`)."""

import torch
import torch.nn.functional as F


def _token_logprobs(hidden, weight, bias, ids, temperature):
    logits = F.linear(hidden, weight, bias)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)


def fused_grpo_loss(hidden, weight, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low,
                    epsilon_high, temperature, loss_type="grpo", importance_sampling_level="token"):
    logp = _token_logprobs(hidden, weight, None, completion_ids, temperature)
    keep = completion_mask != 0
    ratio = torch.exp(logp - old_logprobs.float())
    adv = advantages.float().unsqueeze(-1)
    lo, hi = 1.0 - epsilon_low, 1.0 + epsilon_high
    value = -torch.minimum(ratio * adv, torch.clamp(ratio, lo, hi) * adv)  # the forward: exact
    # BUG: the branch from the ratio in the operands' dtype, as a kernel saving it for backward would have it
    saved = ratio.detach().to(hidden.dtype).float()
    clipped = ((adv > 0) & (saved > hi)) | ((adv < 0) & (saved < lo))
    live = -(ratio * adv)
    per_token = value.detach() + (live - live.detach()) * (~clipped).float()
    m = keep.float()
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
