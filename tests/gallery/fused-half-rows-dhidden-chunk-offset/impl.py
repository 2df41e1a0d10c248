"""Gallery: fails reach. The eager baseline with a half-precision backward that writes d hidden the way a row-chunked
fused kernel with an offset bug does: in bfloat16 and float16, rows (batch x seq, flattened) go in chunks of
ROW_CHUNK and each chunk's d hidden lands at the start of the buffer instead of at its own rows, so past row 1000 every
row's d hidden is zero and the first rows hold the last chunk's. float32 and every call of 1000 rows or fewer are
right (the default CPU workloads hold 514 rows or fewer). On the CPU the fused operation's only calls past 1000 rows
are reach's rows calls. Until the forty-fifth session there was one, float32 for every member: this folder passed every
CPU run. In the forty-fifth it turned through the dtypes for the token-level members only, so sequence-offpolicy-mask
passed every CPU run still. Since the forty-sixth a second rows call (member_calls.ROWS_HALF) is in bfloat16 or float16
for every member, and each member here fails it in every run.

The rest is implementations/fused-torch: logits = hidden @ weight.T (+ bias) in the operands' dtype, then the loss as
TRL's GRPOTrainer computes it from logits (float32 logits / temperature, log_softmax, the ratio against the old
log-probs or detached log-probs, the clipped surrogate, the k3 KL term, the mask and the normaliser).
"""

import torch
import torch.nn.functional as F

# rows per chunk of the flattened batch, sized from a memory budget (not a power of two): every half-precision call past
# 1000 rows shows the bug, CUDA's seq-aligned call (1024+ rows in bfloat16) too, where the rows call stays float32
ROW_CHUNK = 1000


class _ChunkedHalfBackward(torch.autograd.Function):
    """Identity on hidden; its backward, in half precision past ROW_CHUNK rows, writes every chunk at offset 0."""

    @staticmethod
    def forward(ctx, hidden):
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad):
        rows = grad.reshape(-1, grad.shape[-1])
        if grad.dtype == torch.float32 or rows.shape[0] <= ROW_CHUNK:
            return grad
        out = torch.zeros_like(rows)
        for start in range(0, rows.shape[0], ROW_CHUNK):
            chunk = rows[start:start + ROW_CHUNK]
            out[: chunk.shape[0]] = chunk  # BUG: out[start:start + len] is right
        return out.view_as(grad)


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
    logp = _token_logprobs(_ChunkedHalfBackward.apply(hidden), weight, bias, completion_ids, temperature)
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
