"""TRL 1.16's chunked LM-head log-probs, then the GRPO loss: the path GRPOTrainer takes with its fused
LM head (`trl.trainer.utils.add_fused_lm_head`, `trl.kernels.ChunkedLogProbFunction`).

The log-probs of the completion tokens come from `ChunkedLogProbFunction` without the [B, T, V] logits:
cuBLAS tiles of [4096 tokens, 32768 vocabulary] (the trainer's chunk size), each folded into an online
logsumexp (a Triton kernel on CUDA, torch ops elsewhere); its backward recomputes each tile and
accumulates d hidden, d weight and d bias in float32. As the trainer does on a Triton device, only the
unmasked positions are scored (`hidden[mask]`, scattered back with `masked_scatter`); elsewhere every
position is scored and the masked ones zeroed. The loss on those log-probs is the one the trainer
computes (ratio against the old log-probs, detached log-probs when none are given, the clipped
surrogate with the unclipped branch active at ties, the k3 KL, the loss type's normaliser); the
reference log-probs of a reference lm_head come from the same function without gradients.
"""

import torch
from trl.kernels import ChunkedLogProbFunction

CHUNK = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE in TRL 1.16


def _token_logprobs(hidden, weight, bias, ids, temperature, keep):
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_ids = ids.reshape(-1).long()
    compact = hidden.device.type == "cuda"  # the trainer's rule: compact where Triton runs
    if compact:
        rows = keep.reshape(-1)
        logp = ChunkedLogProbFunction.apply(flat_h[rows], weight, bias, flat_ids[rows], temperature, CHUNK,
                                            None, 1.0, ())[0]
        return logp.new_zeros(keep.shape).masked_scatter(keep, logp)
    logp = ChunkedLogProbFunction.apply(flat_h, weight, bias, flat_ids, temperature, CHUNK, None, 1.0, ())[0]
    return logp.view(keep.shape).masked_fill(~keep, 0.0)


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


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    bias=None, old_logprobs=None, ref_logprobs=None, completion_mask=None, ref_weight=None,
                    ref_hidden=None, beta=0.0, loss_type="grpo", importance_sampling_level="token",
                    max_completion_length=None):
    keep = (torch.ones(completion_ids.shape, dtype=torch.bool, device=completion_ids.device)
            if completion_mask is None else completion_mask != 0)
    logp = _token_logprobs(hidden, weight, bias, completion_ids, temperature, keep)
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    if ref_weight is not None:
        with torch.no_grad():
            ref_logprobs = _token_logprobs(hidden if ref_hidden is None else ref_hidden, ref_weight, None,
                                           completion_ids, temperature, keep)
    log_ratio = torch.where(keep, logp - old, torch.zeros_like(logp))
    if importance_sampling_level == "sequence":
        seq = log_ratio.sum(-1) / keep.to(torch.float32).sum(-1).clamp(min=1.0)
        log_ratio = seq.unsqueeze(-1).expand_as(logp)
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(unclipped <= clipped, unclipped, clipped)
    if ref_logprobs is not None and beta != 0.0:
        gap = torch.where(keep, ref_logprobs.float() - logp, torch.zeros_like(logp))
        per_token = per_token + beta * (torch.exp(gap) - gap - 1.0)
    return _reduce(per_token, keep, loss_type, max_completion_length)
