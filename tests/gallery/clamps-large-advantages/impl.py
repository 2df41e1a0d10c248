"""Right on every advantage the drawn sets hold (|A| stays under ~5), wrong above it: the gradient uses the
advantages clipped to [-5, 5], as a kernel with a trainer's advantage clip built in would, while the loss
value stays right. A lone success in a group of 128 completions has A ~= 11.2. Caught by the
trainer-shaped probe's second call (TS-lone), added after the adversarial round of 2026-12-05."""
import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    true = _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
    clipped = _eager(logits, completion_ids, advantages.clamp(-5.0, 5.0), epsilon_low, epsilon_high, temperature)
    return true.detach() + (clipped - clipped.detach())
