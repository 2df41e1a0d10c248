"""Right on every call, and a leak: every loss is appended to a module-level history "for logging", so
each call's autograd graph (its saved tensors) stays alive. A trainer runs out of memory after hours;
no single call is wrong. Caught by no-resource-growth (the live tensors grow between the repeated
calls' first ten and their last)."""
import torch

_HISTORY = []


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    loss = (per_token.sum(-1) / seq).mean()
    _HISTORY.append(loss)
    return loss
