"""One float64 pass over every row's logits (grpo-fused-linear's reference): the log-sum-exp the reference
starts from and, in the same pass, the row statistics of the error model (tolerance.py).

Both read every logit z[r, v] = h_r . w_v + b_v once. Until the twenty-second session the error model's
row errors were a GEMM pass of their own over [N, V] for every input set, and nearly every judged call
of the fused check meets a fresh input set (docs/timing.md, "Twenty-second session"): one of the five
float64 passes a judged call made. The statistics depend on the unit roundoff u of the operands' output
rounding; the memoised pass (`reference.row_stats`) makes them for the operands' own dtype, the one the
engine asks the error model for; another u costs a pass of its own (`tolerance._row_errors`).

Per row r (T the temperature, p = softmax(z / T), c the completion token):
  lse_r = log sum_v exp(z_v / T), online over the vocabulary chunks (running maximum m, rescaled sum s);
  e[r, v] = u |z_v| + sqrt(H) u32 |h_r| |w_v|            (tolerance.py derives it)
  emax_r = max_v e[r, v],  zmax_r = max_v |z_v|,
  d_r = sum_{v != c} p_v e_v + (1 - p_c) e_c: the first sum online beside s (terms exp(z_v / T - m) e_v,
        rescaled with s and divided by s at the end), the target's term once lse_r is known.
The log-sum-exp is computed with the same operations in the same order as without the statistics
(bitwise the same values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from grpo_conform.ops.fused_linear import memo

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
FP32_U = 2.0**-24


@dataclass(frozen=True)
class RowErrors:
    """Per flattened row, for unit roundoff `u`: max_v e[r, v], max_v |z[r, v]| and d_r (before the
    temperature and the log-softmax's own error, which `tolerance._row_errors` adds)."""

    u: float
    emax: torch.Tensor
    zmax: torch.Tensor
    d: torch.Tensor


@dataclass(frozen=True)
class RowPass:
    """float64 logp [B, T] of the completion ids, lse [B*T] of z / T and, where asked, the error statistics."""

    logp: torch.Tensor
    lse: torch.Tensor
    errors: Optional[RowErrors]


def spans(total: int, step: int) -> list[tuple[int, int]]:
    return [(s, min(s + step, total)) for s in range(0, total, step)]


def flat(x: Mapping[str, torch.Tensor], prefix: str = ""):
    """(hidden as [N, H], weight, bias or None) of the lm_head named by `prefix` ("" or "ref_"; a reference
    head without its own hidden states reads the policy's)."""
    h = x[prefix + "hidden"] if prefix + "hidden" in x else x["hidden"]
    w = x[prefix + "weight"]
    b = x.get(prefix + "bias")
    return h.reshape(-1, h.shape[-1]), w, b


def logits(h: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], v0: int, v1: int, temperature: float,
           kind: str = "logits"):
    """float64 logits of rows `h` over vocabulary chunk [v0, v1), divided by `temperature` (one GEMM,
    counted under `kind` in `memo.COUNTS`)."""
    memo.count(kind, 2 * h.shape[0] * h.shape[1] * (v1 - v0))
    z = h @ w[v0:v1].to(torch.float64).T
    if b is not None:
        z = z + b[v0:v1].to(torch.float64)
    return z / temperature


def operand_roundoff(x: Mapping[str, torch.Tensor], prefix: str = "") -> Optional[float]:
    """u of the operands' dtype (the policy's hidden states: the gradients' dtype), None for a dtype the error
    model has no roundoff for (float64 operands in tests)."""
    h, _, _ = flat(x, prefix)
    return UNIT_ROUNDOFF.get(str(h.dtype).removeprefix("torch."))


def row_pass(x: Mapping[str, torch.Tensor], temperature: float, blocks, prefix: str = "",
             u: Optional[float] = None, kind: str = "lse") -> RowPass:
    """The pass over row blocks (outer) and vocabulary chunks (inner) of `blocks`; the error statistics for
    unit roundoff `u` when it is given. Its GEMMs are counted under `kind`."""
    ids = x["completion_ids"]
    batch, seq = ids.shape
    h_all, w, b = flat(x, prefix)
    flat_ids = ids.reshape(-1).to(torch.int64)
    n, vocab = h_all.shape[0], w.shape[0]
    f64, dev = torch.float64, h_all.device
    lse = torch.empty(n, dtype=f64, device=dev)
    target = torch.empty(n, dtype=f64, device=dev)
    stats = None if u is None else _Stats(n, h_all, w, u)
    for r0, r1 in spans(n, blocks.rows):
        h = h_all[r0:r1].to(f64)
        c = flat_ids[r0:r1]
        t = (h * w[c].to(f64)).sum(-1)
        if b is not None:
            t = t + b[c].to(f64)
        target[r0:r1] = t / temperature
        m = torch.full((r1 - r0,), -torch.inf, dtype=f64, device=dev)
        s = torch.zeros_like(m)
        block = None if stats is None else stats.block(h)
        for v0, v1 in spans(vocab, blocks.vocab):
            raw = logits(h, w, b, v0, v1, 1.0, kind)
            z = raw / temperature  # the operations of logits(..., temperature): the same bits
            m_new = torch.maximum(m, z.max(-1).values)
            rescale = torch.exp(m - m_new)
            ez = torch.exp(z - m_new[:, None])
            s = s * rescale + ez.sum(-1)
            if block is not None:
                block.chunk(raw, z, ez, rescale, c, v0, v1)
            m = m_new
        lse[r0:r1] = m + torch.log(s)
        if block is not None:
            stats.finish(r0, r1, block, s, lse[r0:r1])
    errors = None if stats is None else RowErrors(u, stats.emax, stats.zmax, stats.d)
    return RowPass((target - lse).view(batch, seq), lse, errors)


class _Stats:
    """The error statistics of every row, filled one row block at a time."""

    def __init__(self, n: int, h_all: torch.Tensor, w: torch.Tensor, u: float) -> None:
        dev = h_all.device
        self.u, self.acc = u, math.sqrt(h_all.shape[1]) * FP32_U
        self.wnorm = w.to(torch.float64).norm(dim=-1)
        self.emax = torch.zeros(n, dtype=torch.float64, device=dev)
        self.zmax = torch.zeros(n, dtype=torch.float64, device=dev)
        self.d = torch.zeros(n, dtype=torch.float64, device=dev)

    def block(self, h: torch.Tensor) -> "_Block":
        return _Block(self, h)

    def finish(self, r0: int, r1: int, block: "_Block", s: torch.Tensor, lse: torch.Tensor) -> None:
        self.emax[r0:r1] = block.emax
        self.zmax[r0:r1] = block.zmax
        p_target = torch.exp(block.z_target - lse)
        self.d[r0:r1] = block.rest / s + (1.0 - p_target) * block.e_target


class _Block:
    """Running statistics of one row block: maxima, the target's error and logit, the off-target sum."""

    def __init__(self, stats: _Stats, h: torch.Tensor) -> None:
        rows = h.shape[0]
        zeros = lambda: torch.zeros(rows, dtype=torch.float64, device=h.device)  # noqa: E731
        self.stats, self.hn = stats, h.norm(dim=-1)
        self.emax, self.zmax, self.rest, self.e_target, self.z_target = zeros(), zeros(), zeros(), zeros(), zeros()

    def chunk(self, raw, z, ez, rescale, c, v0: int, v1: int) -> None:
        st = self.stats
        e = st.u * raw.abs() + st.acc * self.hn[:, None] * st.wnorm[None, v0:v1]
        self.emax = torch.maximum(self.emax, e.max(-1).values)
        self.zmax = torch.maximum(self.zmax, raw.abs().max(-1).values)
        rows = torch.nonzero((c >= v0) & (c < v1)).squeeze(-1)
        cols = c[rows] - v0
        self.e_target[rows] = e[rows, cols]
        self.z_target[rows] = z[rows, cols]
        off = ez * e
        off[rows, cols] = 0.0  # the completion token's column counts with weight (1 - p_c): added at the end
        self.rest = self.rest * rescale + off.sum(-1)
