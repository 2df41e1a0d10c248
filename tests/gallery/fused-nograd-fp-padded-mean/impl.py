"""implementations/fused-torch with one bug (the forty-second session's red team).

Bug: a forward-only path (no gradient wanted: torch.no_grad, inference_mode, or no input requiring grad) for
float16 / float32 operands, written apart from the training path, takes grpo's per-sequence mean over all S
positions (sum_t m*l / S) instead of over the kept ones (/ max(1, n_b)). The bfloat16 forward-only path and every
training call are right.

Trigger: loss_type grpo with a padded row (n_b < S), operands float16 or float32, no gradient wanted.
"""

import torch
import torch.nn.functional as F


def _token_logprobs(hidden, weight, bias, ids, temperature):
    logits = F.linear(hidden, weight, bias)  # [B, T, V] in the operands' dtype
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)


def _reduce(per_token, keep, loss_type, max_completion_length):
    batch, seq = keep.shape
    m = keep.to(torch.float32)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    if loss_type == "grpo":
        return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo" or loss_type == "dapo":  # one process: this batch's token count
        return per_token.sum() / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        length = seq if max_completion_length is None else max_completion_length
        return per_token.sum() / (batch * length)
    raise ValueError(f"loss_type {loss_type!r} is not implemented here")


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    bias=None, old_logprobs=None, ref_logprobs=None, completion_mask=None, ref_weight=None,
                    ref_hidden=None, beta=0.0, loss_type="grpo", importance_sampling_level="token",
                    max_completion_length=None):
    logp = _token_logprobs(hidden, weight, bias, completion_ids, temperature)
    keep = (torch.ones_like(logp, dtype=torch.bool) if completion_mask is None else completion_mask != 0)
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    if ref_weight is not None:
        with torch.no_grad():
            ref_logprobs = _token_logprobs(hidden if ref_hidden is None else ref_hidden, ref_weight, None,
                                           completion_ids, temperature)
    log_ratio = logp - old
    if importance_sampling_level == "sequence":
        m = keep.to(torch.float32)
        seq_log_ratio = (torch.where(keep, log_ratio, torch.zeros_like(log_ratio)).sum(-1)
                         / m.sum(-1).clamp(min=1.0))
        log_ratio = seq_log_ratio.unsqueeze(-1).expand_as(logp)
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(unclipped <= clipped, unclipped, clipped)
    if ref_logprobs is not None and beta != 0.0:
        gap = ref_logprobs.float() - logp
        per_token = per_token + beta * (torch.exp(gap) - gap - 1.0)
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not wants_grad and hidden.dtype in (torch.float16, torch.float32) and loss_type == "grpo":
        per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
        return (per_token.sum(-1) / keep.shape[-1]).mean()  # BUG: / S, not / max(1, n_b)
    return _reduce(per_token, keep, loss_type, max_completion_length)
