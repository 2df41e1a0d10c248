"""The float64 reference for the `grpo` family (token-level importance sampling).

Everything is computed on the upcast input values in float64, chunked over rows of the logits
so that memory stays bounded whatever the batch (batch 16 of the seed workload is 16.8 GB as one
float64 tensor; a chunk here is at most `budget_bytes`).

The gradient is the closed form (checked against autograd in the tests):
    dL/dz[b,t,v] = (dl/dlogp)[b,t] / (B*S*T) * (onehot(c[b,t])_v - softmax(z[b,t]/T)_v),  t < S
    dL/dz[b,S,v] = 0
with dl/dlogp = -A*r where the unclipped branch is active (ties count as active), else 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

DEFAULT_BUDGET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GrpoParameters:
    epsilon_low: float
    epsilon_high: float
    temperature: float

    @classmethod
    def from_mapping(cls, values: dict) -> "GrpoParameters":
        return cls(float(values["epsilon_low"]), float(values["epsilon_high"]), float(values["temperature"]))


@dataclass(frozen=True)
class GradientChunk:
    """Reference gradient for flattened logits rows [start, stop) (rows run over batch * seq_next)."""

    start: int
    stop: int
    values: torch.Tensor  # float64 [stop - start, vocab]
    scale: torch.Tensor  # float64 [stop - start]: |dL/dlogp| / T, the largest magnitude a row element can have


def rows_per_chunk(vocab: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> int:
    # About four float64 temporaries of a chunk are alive at once.
    return max(1, budget_bytes // (4 * 8 * vocab))


def _token_logp(z: torch.Tensor, ids: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log-probs of the target tokens and the softmax, float64, for rows of z [rows, vocab]."""
    scaled = z / temperature
    lse = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
    return logp, torch.exp(scaled - lse.unsqueeze(-1))


def _clip_coefficient(advantage: torch.Tensor, ratio: torch.Tensor, p: GrpoParameters) -> torch.Tensor:
    """d l / d logp for l = -min(r*A, clip(r)*A): -A*r where the unclipped branch is active."""
    clipped = torch.clamp(ratio, 1.0 - p.epsilon_low, 1.0 + p.epsilon_high)
    active = clipped * advantage >= ratio * advantage
    return torch.where(active, -advantage * ratio, torch.zeros_like(ratio))


def _token_loss(advantage: torch.Tensor, ratio: torch.Tensor, p: GrpoParameters) -> torch.Tensor:
    clipped = torch.clamp(ratio, 1.0 - p.epsilon_low, 1.0 + p.epsilon_high)
    return -torch.minimum(ratio * advantage, clipped * advantage)


def _rows(logits: torch.Tensor, ids: torch.Tensor, start: int, stop: int):
    """Flattened rows [start, stop) of logits, with their batch index, position and target id."""
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    rows = torch.arange(start, stop, device=logits.device)
    b, t = rows // seq_next, rows % seq_next
    z = logits.reshape(batch * seq_next, vocab)[start:stop].to(torch.float64)
    valid = t < seq
    target = torch.zeros_like(rows)
    if seq > 0:
        target[valid] = ids[b[valid], t[valid]]
    return z, b, t, valid, target


def reference_loss(
    logits: torch.Tensor, completion_ids: torch.Tensor, advantages: torch.Tensor, params: GrpoParameters,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> float:
    """The reduced loss in float64: mean over the batch of (sum over tokens of l) / seq."""
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    adv = advantages.to(torch.float64)
    per_seq = torch.zeros(batch, dtype=torch.float64, device=logits.device)
    step = rows_per_chunk(vocab, budget_bytes)
    for start in range(0, batch * seq_next, step):
        stop = min(start + step, batch * seq_next)
        z, b, t, valid, target = _rows(logits, completion_ids, start, stop)
        if not bool(valid.any()):
            continue
        logp, _ = _token_logp(z[valid], target[valid], params.temperature)
        ratio = torch.exp(logp - logp.detach())
        per_seq.index_add_(0, b[valid], _token_loss(adv[b[valid]], ratio, params))
    return float((per_seq / max(1, seq)).mean())


def reference_gradient(
    logits: torch.Tensor, completion_ids: torch.Tensor, advantages: torch.Tensor, params: GrpoParameters,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Iterator[GradientChunk]:
    """Yield the float64 gradient d loss / d logits chunk by chunk over the flattened rows."""
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    adv = advantages.to(torch.float64)
    scale = 1.0 / (batch * max(1, seq) * params.temperature)
    step = rows_per_chunk(vocab, budget_bytes)
    for start in range(0, batch * seq_next, step):
        stop = min(start + step, batch * seq_next)
        z, b, t, valid, target = _rows(logits, completion_ids, start, stop)
        grad = torch.zeros_like(z)
        row_scale = torch.zeros(stop - start, dtype=torch.float64, device=logits.device)
        if bool(valid.any()):
            logp, probs = _token_logp(z[valid], target[valid], params.temperature)
            ratio = torch.exp(logp - logp)
            coef = _clip_coefficient(adv[b[valid]], ratio, params) * scale
            g = -probs
            g.scatter_add_(-1, target[valid].unsqueeze(-1), torch.ones_like(g[:, :1]))
            grad[valid] = g * coef.unsqueeze(-1)
            row_scale[valid] = coef.abs()
        yield GradientChunk(start, stop, grad, row_scale)


def row_scales(advantages: torch.Tensor, seq_next: int, params: GrpoParameters) -> torch.Tensor:
    """Per flattened logits row, |dL/dlogp| / T on-policy (ratio exactly 1); 0 on the last position."""
    batch, seq = advantages.numel(), seq_next - 1
    adv = advantages.to(torch.float64)
    coef = _clip_coefficient(adv, torch.ones_like(adv), params).abs() / (batch * max(1, seq) * params.temperature)
    scales = coef.repeat_interleave(seq_next)
    scales[seq::seq_next] = 0.0
    return scales


def reference_gradient_dense(
    logits: torch.Tensor, completion_ids: torch.Tensor, advantages: torch.Tensor, params: GrpoParameters
) -> torch.Tensor:
    """The whole float64 gradient as one tensor (small inputs and tests only)."""
    out = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    flat = out.view(-1, logits.shape[-1])
    for chunk in reference_gradient(logits, completion_ids, advantages, params):
        flat[chunk.start : chunk.stop] = chunk.values
    return out
