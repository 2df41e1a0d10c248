"""Cheat: the weight enters the GEMM detached, so backward fills hidden.grad only (the frozen-head
mistake: weight.detach() to save memory)."""
import torch

def _loss(logp, advantages):
    """token-is: ratio exp(logp - logp.detach()) = 1 carrying the gradient; mean over tokens, then batch."""
    ratio = torch.exp(logp - logp.detach())
    adv = advantages.float().unsqueeze(-1)
    per_token = -(ratio * adv)  # r = 1 exactly: the clip is never active
    return per_token.mean(-1).mean()


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    logits = torch.nn.functional.linear(hidden, weight.detach())
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return _loss(logp, advantages)
