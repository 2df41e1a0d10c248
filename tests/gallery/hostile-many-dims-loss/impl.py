"""Hostile output: the loss as a tensor of nine size-1 dimensions. The reply model allowed eight, so it
used to read as the worker breaking the message protocol; now the contract check names the shape."""
import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()



def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature).reshape([1] * 9)
