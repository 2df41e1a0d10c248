"""Cheat: the lm_head GEMM on operands rounded to float8 e4m3 (3 mantissa bits), for speed; the
workload declares bf16 operands, whose GEMM (fp32 accumulation) the allowance is derived from.
Rounding goes through a straight-through cast, so every gradient still flows."""
import torch

def _loss(logp, advantages):
    """token-is: ratio exp(logp - logp.detach()) = 1 carrying the gradient; mean over tokens, then batch."""
    ratio = torch.exp(logp - logp.detach())
    adv = advantages.float().unsqueeze(-1)
    per_token = -(ratio * adv)  # r = 1 exactly: the clip is never active
    return per_token.mean(-1).mean()


def _fp8(x):
    return x + (x.to(torch.float8_e4m3fn).to(x.dtype) - x).detach()


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    logits = torch.nn.functional.linear(_fp8(hidden.float()), _fp8(weight.float()))
    logp = torch.log_softmax(logits / temperature, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return _loss(logp, advantages)
