"""The honest eager baseline for spec grpo-token-is.

Everything in float32 whatever the logits dtype. The detach on the old log-probs is what makes
the ratio exactly 1 *and* keeps its gradient: without it (as in Liger's benchmark baseline) the
ratio is exp(0) with no path to the logits and the gradient is identically zero.
"""

import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq, :].float() / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    old = logp.detach()
    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    adv = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    return (per_token.sum(dim=-1) / max(1, seq)).mean()
