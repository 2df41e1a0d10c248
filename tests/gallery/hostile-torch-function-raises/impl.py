"""Hostile output (handled before 2026-12-03): a tensor subclass whose __torch_function__ raises on any
use, so the worker cannot touch the loss. The `runs` check reports the implementation's exception."""
import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


class _Untouchable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("this loss may not be used")


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    loss = _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
    return torch.Tensor._make_subclass(_Untouchable, loss.detach(), True)
