"""A wrong implementation of token-offpolicy-mask (loss type grpo) over logits, for the gallery.

Everything else is the spec's loss: float32 logits over the temperature, the completion token's log-prob, the
clipped surrogate against the old log-probs, the mask and the per-sequence mean then the batch mean. The bug is in
the log-sum-exp: it walks the vocabulary in tiles of 32768 (so [B, T, V] in float32 is never held at once) and keeps
a running maximum and sum, but when a tile raises the maximum the sum of the earlier tiles is not scaled down by
exp(old max - new max). Exact where every row's maximum sits in its first tile, so at every vocabulary of 32768 or
less; wrong on any row whose maximum comes later.
"""

import torch

TILE = 32768


def _logprobs(logits, ids, temperature):
    seq = ids.shape[1]
    z_all = logits[:, :seq, :]
    target = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    run_max = torch.full(ids.shape, float("-inf"), dtype=torch.float32, device=logits.device)
    run_sum = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    idl = ids.long()
    for start in range(0, z_all.shape[-1], TILE):
        z = z_all[..., start:start + TILE].float() / temperature
        new_max = torch.maximum(run_max, z.detach().amax(-1))
        run_sum = run_sum + torch.exp(z - new_max.unsqueeze(-1)).sum(-1)  # BUG: no exp(run_max - new_max) on run_sum
        run_max = new_max
        inside = (idl >= start) & (idl < start + z.shape[-1])
        local = (idl - start).clamp(0, z.shape[-1] - 1)
        target = target + torch.where(inside, z.gather(-1, local.unsqueeze(-1)).squeeze(-1), torch.zeros_like(target))
    return target - (run_max + torch.log(run_sum))


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature, loss_type="grpo",
              importance_sampling_level="token", old_logprobs=None, completion_mask=None, **unused):
    if loss_type != "grpo" or importance_sampling_level != "token":
        raise ValueError("this gallery folder implements token-offpolicy-mask only (loss type grpo, token level)")
    logp = _logprobs(logits, completion_ids, temperature)
    keep = torch.ones_like(logp, dtype=torch.bool) if completion_mask is None else completion_mask != 0
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    ratio = torch.exp(torch.where(keep, logp - old, torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = torch.where(keep, -torch.where(clipped >= unclipped, unclipped, clipped), torch.zeros_like(logp))
    m = keep.to(torch.float32)
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
