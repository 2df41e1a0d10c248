"""A wrong implementation of token-offpolicy-mask (loss type grpo) over logits, for the gallery.

Everything else is the spec's loss: float32 logits over the temperature, the completion token's log-prob, the
clipped surrogate against the old log-probs, the mask and the per-sequence mean then the batch mean. The bug is in
the log-sum-exp: an online one over vocabulary tiles of 4096, rescaled correctly, whose last tile is `V % 4096`
wide. When 4096 divides V that width is 0 and the last full tile is skipped: exact at every odd vocabulary and
every one below 4096 (the CPU workloads' 256, 1536, reach's 139265+), wrong at Mistral's 32768 or Gemma's 262144.
"""

import torch

TILE = 4096


def _logprobs(logits, ids, temperature):
    seq = ids.shape[1]
    z_all = logits[:, :seq, :].float() / temperature
    vocab = z_all.shape[-1]
    tiles = -(-vocab // TILE)
    run_max = torch.full(ids.shape, float("-inf"), dtype=torch.float32, device=logits.device)
    run_sum = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    for i in range(tiles):
        width = TILE if i < tiles - 1 else vocab % TILE  # BUG: 0, not TILE, when TILE divides V
        if width == 0:
            continue
        z = z_all[..., i * TILE:i * TILE + width]
        new_max = torch.maximum(run_max, z.detach().amax(-1))
        run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(z - new_max.unsqueeze(-1)).sum(-1)
        run_max = new_max
    target = z_all.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
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
