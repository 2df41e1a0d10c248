"""The fused operation's allowance for the lm_head GEMM's rounding (docs/operations.md, "Tolerances of
the fused operation", derives it; this module computes it for one input set).

An implementation computes z = hidden @ weight.T (+ bias) from the given operands with fp32
accumulation and may round z to the operands' dtype (torch.nn.functional.linear on bf16 does; an
fp32-upcast kernel keeps fp32). The reference computes z in float64 from the same operands. Per logit

    |dz[r, v]| <= e[r, v] = u * |z[r, v]| + sqrt(H) * u32 * |h_r| |w_v|

(u the unit roundoff of the operands' dtype: the output rounding; u32 = 2^-24 with sqrt(H) the
statistical growth of an fp32 dot product of length H, bounded by |h_r||w_v| >= sum_k |h_rk w_vk|).
Through the temperature, every log-softmax input of row r moves by at most E_r = max_v e[r, v] / T, so

  - a probability by p_v * expm1(2 E_r) (its own logit and the log-sum-exp both move);
  - the completion token's log-prob by d_r = ((1 - p_c) e_c + sum_{v != c} p_v e_v) / T (the shared
    part of z_c and the log-sum-exp cancels: a near one-hot row moves by almost nothing);
  - dL/dlogp by coef_error (the shared GRPO terms, `token_terms(logp_error=d)`), the loss by loss_error.

d logits[r, v] = g_r (onehot - p_v) then moves by at most (s_r expm1(2 E_r) + dg_r) (onehot_v + p_v), with
s_r >= |g_r| the reference's row scale: the same shape as the reference's unit bound, so each gradient
unit's allowance is its `scale` times a factor F: F_r = expm1(2 E_r) + dg_r / s_r for a hidden row, and
max_r F_r for a weight row or a bias entry (a sum over rows). The implementation's own rounding of
d logits and of the gradients to the operands' dtype adds 2u. With a reference lm_head (ref_weight)
the reference log-probs carry the same kind of error; it is added to d (the KL term moves with the
difference ref - logp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from grpo_conform.ops.fused_linear.reference import Blocks, _blocks, _flat, _logits, _spans, logprobs_and_lse
from grpo_conform.ops.grpo_terms import GrpoParameters, token_terms

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
FP32_U = 2.0**-24


@dataclass(frozen=True)
class GemmAllowance:
    """Per gradient name, the factor of each unit's scale allowed on top of the spec's tolerance
    ([units] for hidden, a float for weight and bias); the loss's absolute allowance; the largest
    E_r (for the evidence)."""

    factors: dict[str, torch.Tensor | float]
    loss: float
    max_logit_error: float

    def for_units(self, name: str, start: int, stop: int, device) -> torch.Tensor | float:
        f = self.factors[name]
        return f[start:stop].to(device) if isinstance(f, torch.Tensor) else f


def _row_errors(x: Mapping[str, torch.Tensor], p: GrpoParameters, u: float, prefix: str, blocks: Blocks,
                lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E_r = max_v e[r, v] / T, d_r the log-prob error bound) per flattened row."""
    h_all, w, b = _flat(x, prefix)
    hidden = h_all.shape[1]
    ids = x["completion_ids"].reshape(-1).to(torch.int64)
    acc = math.sqrt(hidden) * FP32_U
    wnorm = w.to(torch.float64).norm(dim=-1)
    n = h_all.shape[0]
    emax = torch.zeros(n, dtype=torch.float64, device=h_all.device)
    d = torch.zeros(n, dtype=torch.float64, device=h_all.device)
    for r0, r1 in _spans(n, blocks.rows):
        h = h_all[r0:r1].to(torch.float64)
        hn = h.norm(dim=-1)
        c = ids[r0:r1]
        for v0, v1 in _spans(w.shape[0], blocks.vocab):
            z = _logits(h, w, b, v0, v1, 1.0)
            e = u * z.abs() + acc * hn[:, None] * wnorm[None, v0:v1]
            prob = torch.exp(z / p.temperature - lse[r0:r1, None])
            emax[r0:r1] = torch.maximum(emax[r0:r1], e.max(-1).values)
            inside = (c >= v0) & (c < v1)
            rows = torch.nonzero(inside).squeeze(-1)
            contrib = prob * e
            # the completion token's column counts with weight (1 - p_c) instead of p_c
            contrib[rows, c[rows] - v0] = (1.0 - prob[rows, c[rows] - v0]) * e[rows, c[rows] - v0]
            d[r0:r1] += contrib.sum(-1)
    return emax / p.temperature, d / p.temperature


def gemm_allowance(x: Mapping[str, torch.Tensor], p: GrpoParameters, dtype: str,
                   blocks: Blocks | None = None) -> GemmAllowance:
    u = UNIT_ROUNDOFF[dtype]
    blocks = _blocks(x, blocks)
    logp, lse = logprobs_and_lse(x, p, blocks)
    emax, d = _row_errors(x, p, u, "", blocks, lse)
    batch, seq = x["completion_ids"].shape
    terms_x = dict(x)
    if "ref_weight" in x:
        ref, ref_lse = logprobs_and_lse(x, p, blocks, prefix="ref_")
        _, d_ref = _row_errors(x, p, u, "ref_", blocks, ref_lse)
        d = d + d_ref
        terms_x["ref_logprobs"] = ref
    tt = token_terms(terms_x, p, logp, logp_error=d.view(batch, seq))
    s = (tt.scale / p.temperature).reshape(-1)
    dg = torch.zeros_like(s) if tt.coef_error is None else (tt.coef_error / p.temperature).reshape(-1)
    row = torch.expm1(2.0 * emax) + torch.where(s > 0, dg / s.clamp_min(1e-300), torch.zeros_like(s)) + 2.0 * u
    everywhere = float(row.max()) if row.numel() else 0.0
    factors: dict[str, torch.Tensor | float] = {"hidden": row, "weight": everywhere}
    if x.get("bias") is not None:
        factors["bias"] = everywhere
    loss = 0.0 if tt.loss_error is None else float(tt.loss_error.sum())
    return GemmAllowance(factors, loss, float(emax.max()) if emax.numel() else 0.0)
