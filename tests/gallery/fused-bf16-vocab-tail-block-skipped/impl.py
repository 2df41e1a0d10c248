"""Gallery: fails reach. The eager baseline with a blocked log-sum-exp: in bfloat16 the normaliser sums the vocabulary
in blocks of BLOCK_V and skips the last, partial block, so past 4096 columns not a multiple of 4096 the log-probs
miss the tail's probability mass. The CPU tier meets a vocabulary past 4096 only in reach's vocabulary call, which was
float16 for every member of the fused family until the free-axis dtypes turned with the member
(member_calls.member_turn). The folder claims three consecutive members, so that call meets bfloat16 in every run.

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


BLOCK_V = 4096  # vocabulary columns per block of the normaliser


def _token_logprobs(hidden, weight, bias, ids, temperature):
    logits = F.linear(hidden, weight, bias)  # [B, T, V] in the operands' dtype
    z = logits.float() / temperature
    vocab = z.shape[-1]
    if logits.dtype == torch.bfloat16 and vocab > BLOCK_V:
        lse = torch.logsumexp(z[..., :vocab - vocab % BLOCK_V], dim=-1)  # BUG: the partial last block is skipped
    else:
        lse = torch.logsumexp(z, dim=-1)
    return z.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1) - lse


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
