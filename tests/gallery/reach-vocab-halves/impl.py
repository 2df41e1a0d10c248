"""A wrong implementation of token-offpolicy-mask (loss type grpo) over logits, for the gallery.

A large-vocabulary path (V > 131072) takes the log-sum-exp in two blocks, the upper half of the vocabulary first
and the lower half after it, and forgets to scale the first block's sum down when the lower half raises the
maximum. Exact below 131072 (one block), and exact wherever every row's maximum lies in the upper half. Everything
else is the spec's loss, as tests/gallery/reach-vocab-tiles-32768 computes it.
"""

import torch

LARGE = 131072


def _lse(z):
    vocab = z.shape[-1]
    if vocab <= LARGE:
        return torch.logsumexp(z, -1)
    upper, lower = z[..., vocab // 2:], z[..., : vocab // 2]
    m1 = upper.detach().amax(-1)
    s1 = torch.exp(upper - m1.unsqueeze(-1)).sum(-1)
    m2 = torch.maximum(m1, lower.detach().amax(-1))
    s2 = s1 + torch.exp(lower - m2.unsqueeze(-1)).sum(-1)  # BUG: s1 is not scaled by exp(m1 - m2)
    return m2 + torch.log(s2)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature, loss_type="grpo",
              importance_sampling_level="token", old_logprobs=None, completion_mask=None, **unused):
    if loss_type != "grpo" or importance_sampling_level != "token":
        raise ValueError("this gallery folder implements token-offpolicy-mask only (loss type grpo, token level)")
    seq = completion_ids.shape[1]
    z = logits[:, :seq, :].float() / temperature
    logp = z.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1) - _lse(z)
    keep = torch.ones_like(logp, dtype=torch.bool) if completion_mask is None else completion_mask != 0
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    ratio = torch.exp(torch.where(keep, logp - old, torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = torch.where(keep, -torch.where(clipped >= unclipped, unclipped, clipped), torch.zeros_like(logp))
    m = keep.to(torch.float32)
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
