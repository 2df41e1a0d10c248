"""Gallery: fails reach. The eager baseline with its own lm_head backward: d weight summed over chunks of CHUNK rows,
and in bfloat16 and float16 the chunk loop assigns instead of adding, so past CHUNK rows only the last chunk's rows
reach d weight (float32 adds). The CPU tier meets more than 1024 rows only in reach's rows call, which was float32
for every member of the fused family until the free-axis dtypes turned with the member (member_calls.member_turn).
The folder claims three consecutive members of the family, so that call meets every dtype in every run.

The rest is implementations/fused-torch:

logits = hidden @ weight.T (+ bias) is one GEMM in the operands' dtype (bf16 in, fp32 accumulation,
bf16 out on CUDA: torch.nn.functional.linear), materialised [B, T, V]; then the loss as TRL's
GRPOTrainer computes it from logits: float32 logits / temperature, log_softmax, the completion
token's log-prob, the ratio against the old log-probs (detached log-probs when none are given, so
the ratio is exactly 1 and keeps its gradient), the clipped surrogate, the k3 KL term, the mask and
the loss type's normaliser. Autograd gives d hidden, d weight and d bias through the GEMM.

KL through a reference lm_head (inputs ref_weight, ref_hidden): the reference log-probs are the
same log-softmax of ref_hidden @ ref_weight.T (ref_hidden absent: hidden), under no_grad.

Ties: where the unclipped and the clipped term are equal the unclipped branch is active
(`torch.where` on `>=`), as the spec says.
"""

import torch
import torch.nn.functional as F


CHUNK = 1024  # rows of d logits per d weight GEMM


class _LmHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias):
        ctx.save_for_backward(hidden, weight)
        ctx.has_bias = bias is not None
        return F.linear(hidden, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        h = hidden.reshape(-1, hidden.shape[-1])
        d_hidden = (g @ weight).reshape(hidden.shape) if ctx.needs_input_grad[0] else None
        d_weight = None
        if ctx.needs_input_grad[1]:
            for start in range(0, g.shape[0], CHUNK):
                part = g[start:start + CHUNK].float().t() @ h[start:start + CHUNK].float()
                if d_weight is None or weight.dtype != torch.float32:
                    d_weight = part  # BUG: in half precision each chunk replaces the sum instead of adding to it
                else:
                    d_weight = d_weight + part
            d_weight = d_weight.to(weight.dtype)
        d_bias = g.float().sum(0).to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return d_hidden, d_weight, d_bias


def _token_logprobs(hidden, weight, bias, ids, temperature):
    logits = _LmHead.apply(hidden, weight, bias)  # [B, T, V] in the operands' dtype
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
    return _reduce(per_token, keep, loss_type, max_completion_length)
