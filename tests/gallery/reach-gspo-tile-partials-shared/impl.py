import torch

TILE = 1024  # positions per program; longer rows are reduced in two passes


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    B, seq = completion_ids.shape
    logp = torch.log_softmax(logits[:, :seq].double() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).double()
    n = m.sum(-1).clamp(min=1.0)
    d = (logp - old_logprobs.double()) * m
    if seq <= TILE:
        total = d.sum(-1)  # one pass
    else:
        tiles = -(-seq // TILE)
        padded = torch.nn.functional.pad(d, (0, tiles * TILE - seq))
        partial = padded.view(B, tiles, TILE).sum(-1)  # [B, tiles]
        # BUG: the second pass's buffer is indexed by tile only (partial[tile] += ...): every sequence's
        # partial sums land in the same slots, and every sequence reads the batch's total back
        shared = partial.sum(0)
        total = shared.sum().expand(B)
    s = torch.exp(total / n).unsqueeze(-1)
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.minimum(s * a, torch.clamp(s, 1 - epsilon_low, 1 + epsilon_high) * a)
    return ((per_token * m).sum(-1) / n).mean().float()
