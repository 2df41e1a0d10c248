import torch


def closed_form(logits, ids, adv, temperature):
    """The exact gradient of the spec (rows t < S) in float32, and the loss value -mean(A)."""
    b, s1, v = logits.shape
    seq = s1 - 1
    z = logits[:, :seq].float() / temperature
    p = torch.softmax(z, -1)
    p.scatter_add_(-1, ids.unsqueeze(-1), -torch.ones_like(p[..., :1]))
    coef = adv.float().view(b, 1, 1) / (b * seq * temperature)
    return (-adv.float()).mean(), coef * p


def full_gradient(logits, g):
    out = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)
    out[:, : g.shape[1]] = g.to(logits.dtype)
    return out


def _as_contiguous_storage(t):
    # What a raw-pointer kernel that ignores strides and the storage offset sees.
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, t.shape)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    ids = _as_contiguous_storage(completion_ids)
    adv = _as_contiguous_storage(advantages)
    z = logits[:, : ids.shape[1]].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / ids.shape[1]).mean()
