"""implementations/fused-torch with one bug (the forty-second session's red team).

Bug: the reference lm_head's log-probs (the second GEMM, no gradient) are cached across calls, as a trainer's
reference model is frozen and GRPO's num_iterations > 1 repeats a batch: the last call's reference log-probs are
reused when the key matches. The key is a cheap fingerprint: the data pointers, shapes, dtypes and temperature of
ref_hidden (or hidden), ref_weight and completion_ids, plus the SUM of each of them. A sum does not see a
permutation: ref_hidden rows or completion ids exchanged in place (the same buffers, the same values in another
order: a trainer's batch reshuffled into reused buffers) give stale reference log-probs at the moved positions.

Trigger: kl-ref-weight member, a call whose ref_hidden / completion_ids / ref_weight hold a permutation of the
previous call's values in the same buffers (one-entry cache: only the immediately preceding call).
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


_REF_CACHE = {}  # one entry: the last call's reference log-probs


def _fingerprint(t):
    """BUG: a cheap key; a sum is blind to a permutation of the values."""
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), float(t.double().sum()))


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    bias=None, old_logprobs=None, ref_logprobs=None, completion_mask=None, ref_weight=None,
                    ref_hidden=None, beta=0.0, loss_type="grpo", importance_sampling_level="token",
                    max_completion_length=None):
    logp = _token_logprobs(hidden, weight, bias, completion_ids, temperature)
    keep = (torch.ones_like(logp, dtype=torch.bool) if completion_mask is None else completion_mask != 0)
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    if ref_weight is not None:
        with torch.no_grad():
            ref_in = hidden if ref_hidden is None else ref_hidden
            key = (_fingerprint(ref_in), _fingerprint(ref_weight), _fingerprint(completion_ids), float(temperature))
            if _REF_CACHE.get("key") == key:
                ref_logprobs = _REF_CACHE["value"].clone()
            else:
                ref_logprobs = _token_logprobs(ref_in, ref_weight, None, completion_ids, temperature)
                _REF_CACHE["key"], _REF_CACHE["value"] = key, ref_logprobs.clone()
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
