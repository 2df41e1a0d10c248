"""Right on every call, and a leak: each call opens a log file and keeps the handle, so a trainer hits
the open-file limit (1024 by default) after about a thousand steps. Caught by no-resource-growth (the
open file descriptors grow between the repeated calls' first ten and their last)."""
import os

import torch

_LOGS = []


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    _LOGS.append(open(os.devnull, "w"))
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean()
