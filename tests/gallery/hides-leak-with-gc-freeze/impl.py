"""keeps-graph-per-call's leak, hidden: every loss (and so its graph) is appended to a module-level
history, and gc.freeze() then moves it to the collector's permanent generation, which gc.get_objects()
does not list. The tensor count the worker samples stays flat while memory grows per step. Caught by
no-resource-growth through the frozen-object count (isolation/resources.py): the worker froze once,
before this module was imported, so any later change there is the implementation's."""
import gc

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
    gc.freeze()
    return loss
