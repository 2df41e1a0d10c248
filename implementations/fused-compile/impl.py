"""torch.compile of the eager fused baseline (implementations/fused-torch, repeated here because a folder
must hold everything it runs) for every grpo-fused-linear member it declares: the lm_head GEMM stays a
library call (cuBLAS on CUDA), Inductor fuses what follows (the float32 cast, temperature, log-softmax,
gather and loss) and generates their backward; the [B, T, V] logits are still materialised, as they are
in the eager code. torch.compile's defaults (a static graph for the first shape, then one with dynamic
shapes), the recompile limit raised so the validator's shapes and members never fall back to eager.

One default is changed: `torch._functorch.config.donated_buffer`. With it on (torch 2.13's default), the
compiled backward frees saved buffers it donates, and `backward(retain_graph=True)` raises ("This backward
function was compiled with non-empty donated buffers ..."): the retained-graph probe failed `runs` on every
CPU workload, and the seed benchmark's own backward protocol retains the graph. Off, the compiled graph
is usable the way trainers call it (recorded in docs/operations.md).
"""

import torch
import torch._dynamo
import torch.nn.functional as F

torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
torch._functorch.config.donated_buffer = False  # else a retained graph's second backward raises (docstring)


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
    if loss_type in ("bnpo", "dapo"):  # one process: this batch's token count
        return per_token.sum() / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return per_token.sum() / (batch * (seq if max_completion_length is None else max_completion_length))
    raise ValueError(f"loss_type {loss_type!r}: not a loss type of grpo-fused-linear")


def _loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature, bias, old_logprobs,
          ref_logprobs, completion_mask, ref_weight, ref_hidden, beta, loss_type, importance_sampling_level,
          max_completion_length):
    logp = _token_logprobs(hidden, weight, bias, completion_ids, temperature)
    keep = torch.ones_like(logp, dtype=torch.bool) if completion_mask is None else completion_mask != 0
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    if ref_weight is not None:
        with torch.no_grad():
            ref_logprobs = _token_logprobs(hidden if ref_hidden is None else ref_hidden, ref_weight, None,
                                           completion_ids, temperature)
    log_ratio = logp - old
    if importance_sampling_level == "sequence":
        m = keep.to(torch.float32)
        seq = torch.where(keep, log_ratio, torch.zeros_like(log_ratio)).sum(-1) / m.sum(-1).clamp(min=1.0)
        log_ratio = seq.unsqueeze(-1).expand_as(logp)
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(unclipped <= clipped, unclipped, clipped)
    if ref_logprobs is not None and beta != 0.0:
        gap = ref_logprobs.float() - logp
        per_token = per_token + beta * (torch.exp(gap) - gap - 1.0)
    return _reduce(per_token, keep, loss_type, max_completion_length)


_compiled = torch.compile(_loss)


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    bias=None, old_logprobs=None, ref_logprobs=None, completion_mask=None, ref_weight=None,
                    ref_hidden=None, beta=0.0, loss_type="grpo", importance_sampling_level="token",
                    max_completion_length=None):
    return _compiled(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature, bias,
                     old_logprobs, ref_logprobs, completion_mask, ref_weight, ref_hidden, beta, loss_type,
                     importance_sampling_level, max_completion_length)
