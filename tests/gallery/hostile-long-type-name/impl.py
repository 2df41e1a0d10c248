"""Hostile output: an object whose class name is 5000 characters long. The reply model caps names at
300 characters, so it used to read as the worker breaking the message protocol; now the name is cut
and the contract check reports that the loss is not a tensor."""
import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()



def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return type('L' * 5000, (), {})()
