"""The fused operation's allowance for the lm_head GEMM's rounding (docs/operations.md, "Tolerances of
the fused operation", derives it; this module computes it for one input set).

An implementation computes z = hidden @ weight.T (+ bias) from the given operands with fp32
accumulation and may round z to the operands' dtype (torch.nn.functional.linear on bf16 does; an
fp32-upcast kernel keeps fp32). The reference computes z in float64 from the same operands. Per logit

    |dz[r, v]| <= e[r, v] = u * |z[r, v]| + sqrt(H) * u32 * |h_r| |w_v|

(u the unit roundoff of the operands' dtype: the output rounding; u32 = 2^-24 with sqrt(H) the
statistical growth of an fp32 dot product of length H, bounded by |h_r||w_v| >= sum_k |h_rk w_vk|).
Through the temperature, every log-softmax input of row r moves by at most E_r = max_v e[r, v] / T (plus
the implementation's own fp32 log-softmax error, 2 u32 (1 + max|z|/T + ln V), added to E_r and d_r), so

  - a probability by p_v * expm1(2 E_r) (its own logit and the log-sum-exp both move);
  - the completion token's log-prob by d_r = ((1 - p_c) e_c + sum_{v != c} p_v e_v) / T (the shared
    part of z_c and the log-sum-exp cancels: a near one-hot row moves by almost nothing);
  - g_r = dL/dlogp / T by dg_r: the larger of the shared terms' smooth bound (`token_terms`'
    coef_error at logp_error = d) and the change of g when every log-prob sits at logp + d or at
    logp - d, or a hair to either side of a clip bound within d, which covers a clip branch or a cap
    crossed (a ratio within d of a bound may fall on either side in the implementation's arithmetic;
    the hair, because a shift computed to land on the bound rounds to either side of it); the
    loss's move likewise (`moves.py`).

d logits[r, v] = g_r (onehot - p_v) then moves by at most |g_r| x p_v + dg_r (onehot_v + p_v (1 + x)) <=
a_r (onehot_v + p_v), x = expm1(2 E_r), a_r = |g_r| x + dg_r (1 + x), so a unit of each gradient may move
by (absolute, per unit):
  d hidden[r, :]  a_r * (wmax[c_r] + sum_v p_rv wmax_v)        (wmax_v = max_k |weight[v, k]|)
  d weight[v, :]  sum_r a_r (onehot_rv + p_rv) hmax_r          (hmax_r = max_k |hidden[r, k]|)
  d bias[v]       sum_r a_r (onehot_rv + p_rv)
plus 2u of the unit's reference scale and of that allowance (the implementation rounds d logits and the
gradients to the operands' dtype: values up to the reference's plus the allowed move). With a reference lm_head (ref_weight) the reference log-probs carry the same kind
of error, d_ref, independent of the policy's: d = d_pol + d_ref bounds the KL gap's move, and dg adds
the KL term's bound at d to the largest move of the terms that read the policy's log-probs alone
(one shift moving both would hold the KL gap to the ratio's move at a clip crossing).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from collections.abc import Mapping

import torch

from grpo_conform.compare import sum_error
from grpo_conform.ops.fused_linear import memo
from grpo_conform.ops.fused_linear.moves import coefficient_moves
from grpo_conform.ops.fused_linear.reference import Blocks, _blocks, logprobs_and_lse, row_stats
from grpo_conform.ops.fused_linear.row_pass import (FP32_U, UNIT_ROUNDOFF, flat, logits, operand_roundoff, row_pass,
                                                     spans)
from grpo_conform.ops.grpo_terms import GrpoParameters

# below the normal range of float32 and bfloat16 (the same exponent range) GEMMs flush operands and results
# to zero (GPUs' ftz, CPUs' DAZ/FTZ in BLAS): each d logits term may lose all of itself up to this value.
# float16 keeps its subnormals, but a d logits term below its normal range (2^-14) is held to the subnormal
# step 2^-24 in absolute terms, once per rounding that forms it (p, then its scaled difference): a normaliser
# of ~1e4 (dr-grpo's constant, long rows) puts whole rows there. Found by the reach probe's first float16
# calls of this operation (twenty-seventh session): fused-torch at dr-grpo-mask, d weight 7.7e-7 for 4.4e-7.
FLUSHED_BELOW = {"bfloat16": 2.0**-126, "float32": 2.0**-126, "float16": 2.0**-23}


@dataclass(frozen=True)
class GemmAllowance:
    """Per gradient name, each unit's absolute allowance at upstream 1 ([units]) and the factor of the
    unit's reference scale for the implementation's own rounding (`rel`); the loss's absolute
    allowance; the largest E_r (for the evidence)."""

    units: Mapping[str, torch.Tensor]  # a `UnitSums`: made when first read, or by the gradients' sweep
    rel: float
    loss: float
    max_logit_error: float
    # per gradient name, an absolute floor of every element (not scaled by the upstream scalar: the flush
    # threshold is the dtype's): what a GEMM that flushes subnormal d logits to zero may lose (`_underflow`)
    underflow: Mapping[str, float] = field(default_factory=dict)
    # The fused operation's gradients may be formed in forward, before the upstream scalar is known, at 1 or at
    # a predicted scalar of magnitude >= 1 (Liger's fused path; ours: FusedPlan.observe), so the absolute floors
    # (the dtype's subnormal step, `underflow`) are those of the gradient at upstream 1, scaled with it by
    # max(1, |c|) (docs/checks.md, "float16 and the other declared dtypes")
    formed_before_upstream: bool = True

    def allowance(self, name: str, start: int, stop: int, scale: torch.Tensor) -> torch.Tensor:
        """Absolute allowance of units [start, stop) whose reference scale (at upstream 1) is `scale`; the
        caller multiplies it by |upstream|. The implementation's own rounding (`rel`) applies to values
        as large as the reference's scale plus the allowed move itself: at a clip crossing d logits of a
        token whose reference gradient is ~0 are as large as its whole allowance."""
        units = self.units
        part = (units.part(name, start, stop) if isinstance(units, UnitSums) else units[name][start:stop]).to(scale.device)
        return part * (1.0 + self.rel) + self.rel * scale


class UnitSums(Mapping):
    """The unit sums of one allowance by gradient name (hidden, weight and, with a bias, bias), made once:
    by the reference gradients' sweep when it runs first on the same input set (`reference._Sweep`, which
    computes the probabilities these sums need anyway: one float64 pass fewer), else on their own
    (`_unit_sums`) when first read. A loss-only use (forward-only calls, timed forward re-checks) never
    makes them. In the sweep the sums of a vocabulary chunk are complete when its d weight chunk is
    handed out: a chunk read then is served; anything else read before the sweep's end makes them on
    their own. Both ways add the same terms in the same order (bitwise the same sums on the CPU)."""

    NAMES = ("hidden", "weight", "bias")

    def __init__(self, x, p: GrpoParameters, blocks: Blocks, lse: torch.Tensor, a: torch.Tensor, bias: bool) -> None:
        # the input set's tensors held weakly: this object lives in the memo (memo.py), whose entries die with
        # their input set's tensors; a strong reference here kept every memoised set alive, up to memo.LIMIT
        # sets of weights in the parent (found on the H200: 4.1-6.3 GiB after a reference-weight workload)
        self._x = {k: (weakref.ref(v) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
        self._args = (p, blocks, lse, a)
        self._names = self.NAMES if bias else self.NAMES[:2]
        self._sums: tuple[torch.Tensor, ...] | None = None
        self._fill: tuple[torch.Tensor, ...] | None = None
        self._upto = 0  # vocabulary rows [0, upto) of the weight and bias sums complete in the sweep

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.part(name, 0, None)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def part(self, name: str, start: int, stop: int | None) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        i = self.NAMES.index(name)
        if self._sums is None:
            if self._fill is not None and name != "hidden" and stop is not None and stop <= self._upto:
                return self._fill[i][start:stop]
            self._sums, self._fill = _unit_sums(self._inputs(), *self._args), None
        return self._sums[i][start:stop]

    def _inputs(self) -> dict:
        x = {k: (v() if isinstance(v, weakref.ref) else v) for k, v in self._x.items()}
        gone = sorted(k for k, v in self._x.items() if isinstance(v, weakref.ref) and x[k] is None)
        if gone:  # a caller kept the allowance past its input set: an error of grpo-conform, never of a kernel
            raise RuntimeError(f"the unit sums' input set is gone ({', '.join(gone)} freed): judge while it is alive")
        return x

    # -- filled by the gradients' sweep (reference._Sweep) -------------------------------------------
    def start(self, h_all: torch.Tensor, ids: torch.Tensor, wmax: torch.Tensor, blocks: Blocks) -> bool:
        """Take the sums over (False where they are made already or another sweep has them): each
        row's target term first, as `_unit_sums` adds it first."""
        if self._sums is not None or self._fill is not None:
            return False
        a = self._args[3]
        n, vocab = h_all.shape[0], wmax.shape[0]
        hid = torch.zeros(n, dtype=torch.float64, device=h_all.device)
        for r0, r1 in spans(n, blocks.rows):
            hid[r0:r1] += a[r0:r1] * wmax[ids[r0:r1]]
        self._fill = (hid, torch.zeros(vocab, dtype=torch.float64, device=h_all.device),
                      torch.zeros(vocab, dtype=torch.float64, device=h_all.device))
        return True

    def add(self, r0: int, r1: int, v0: int, v1: int, h: torch.Tensor, c: torch.Tensor, wmax: torch.Tensor,
            prob: torch.Tensor) -> None:
        """Rows [r0, r1) x vocabulary chunk [v0, v1): `_unit_sums`' terms of that block, then the target
        terms of the rows whose target lies in the chunk (its `index_add_` of the row block, restricted)."""
        if self._fill is None:
            return
        hid, wt, bs = self._fill
        ar = self._args[3][r0:r1]
        arh = ar * h.abs().amax(-1)
        hid[r0:r1] += ar * (prob @ wmax[v0:v1])
        wt[v0:v1] += arh @ prob
        bs[v0:v1] += ar @ prob
        inside = torch.nonzero((c >= v0) & (c < v1)).squeeze(-1)
        wt[v0:v1].index_add_(0, c[inside] - v0, arh[inside])
        bs[v0:v1].index_add_(0, c[inside] - v0, ar[inside])

    def chunk_done(self, v1: int) -> None:
        if self._fill is not None:
            self._upto = v1

    def finish(self) -> None:
        if self._fill is not None:
            self._sums, self._fill = self._fill, None


def _row_errors(x, p: GrpoParameters, u: float, prefix: str, blocks: Blocks):
    """(E_r = max_v e[r, v] / T, d_r the log-prob error bound) per flattened row: the statistics the
    memoised row pass made on its way (`reference.row_stats`), or, for a roundoff other than the
    operands' own, a pass of their own (`row_pass.py` says how both are computed)."""
    rows = row_stats(x, p, blocks, prefix)
    errors = rows.errors
    if errors is None or errors.u != u:
        kept = memo.state(x)
        key = ("row-errors", prefix, float(p.temperature), blocks, u)
        if key not in kept:
            kept[key] = row_pass(x, p.temperature, blocks, prefix, u=u, kind="row-errors").errors
        errors = kept[key]
    vocab = flat(x, prefix)[1].shape[0]
    # the implementation's own fp32 log-softmax: about 2 u32 (1 + max|z|/T + ln V) on every log-prob, plus its sum of
    # V exponentials (compare.sum_error), the row's largest probability bounded by exp(max|z|/T - lse)
    _, lse = logprobs_and_lse(x, p, blocks, prefix=prefix)
    p_max = torch.exp(errors.zmax / p.temperature - lse.to(errors.zmax.device, torch.float64))
    softmax = 2.0 * FP32_U * (1.0 + errors.zmax / p.temperature + math.log(vocab)) + sum_error(vocab, p_max)
    return errors.emax / p.temperature + softmax, errors.d / p.temperature + softmax


def logprob_allowance(x: Mapping[str, torch.Tensor], p: GrpoParameters) -> torch.Tensor | None:
    """[B, T] float64: how far an implementation's log-prob of each completion token may lie from the reference's
    (d_r of the policy's head for operands in their own dtype, the memoised row pass's), or None for operands the
    error model has no roundoff for. What near ties keep their distances above (`near_ties.py`)."""
    u = operand_roundoff(x)
    if u is None:
        return None
    _, d = _row_errors(x, p, u, "", _blocks(x, None))
    return d.view(x["completion_ids"].shape).cpu()


def _unit_sums(x, p: GrpoParameters, blocks: Blocks, lse: torch.Tensor, a: torch.Tensor):
    """(hidden rows' a_r K_r, weight rows' sum_r a_r (onehot + p) hmax_r, the same without hmax for bias)."""
    h_all, w, b = flat(x)
    ids = x["completion_ids"].reshape(-1).to(torch.int64)
    wmax = w.abs().amax(-1).to(torch.float64)
    n, vocab = h_all.shape[0], w.shape[0]
    hid = torch.zeros(n, dtype=torch.float64, device=h_all.device)
    wt = torch.zeros(vocab, dtype=torch.float64, device=h_all.device)
    bs = torch.zeros(vocab, dtype=torch.float64, device=h_all.device)
    for r0, r1 in spans(n, blocks.rows):
        h = h_all[r0:r1].to(torch.float64)
        hmax = h.abs().amax(-1)
        ar = a[r0:r1]
        c = ids[r0:r1]
        hid[r0:r1] += ar * wmax[c]
        for v0, v1 in spans(vocab, blocks.vocab):
            prob = torch.exp(logits(h, w, b, v0, v1, p.temperature, "unit-sums") - lse[r0:r1, None])
            hid[r0:r1] += ar * (prob @ wmax[v0:v1])
            wt[v0:v1] += (ar * hmax) @ prob
            bs[v0:v1] += ar @ prob
        wt.index_add_(0, c, ar * hmax)
        bs.index_add_(0, c, ar)
    return hid, wt, bs


def gemm_allowance(x: Mapping[str, torch.Tensor], p: GrpoParameters, dtype: str,
                   blocks: Blocks | None = None) -> GemmAllowance:
    """The allowance of input set `x` at parameters `p` for operands in `dtype`: computed once per input
    set, parameters, dtype and blocks (`memo.py`; every judgment of the same inputs reuses it)."""
    blocks = _blocks(x, blocks)
    kept = memo.state(x)
    key = ("allowance", dtype, repr(p), blocks)
    if key not in kept:
        kept[key] = _gemm_allowance(x, p, dtype, blocks)
    return kept[key]


def _gemm_allowance(x: Mapping[str, torch.Tensor], p: GrpoParameters, dtype: str, blocks: Blocks) -> GemmAllowance:
    u = UNIT_ROUNDOFF[dtype]
    logp, lse = logprobs_and_lse(x, p, blocks)
    emax, d = _row_errors(x, p, u, "", blocks)
    batch, seq = x["completion_ids"].shape
    terms_x = dict(x)
    if "ref_weight" in x:
        ref, _ = logprobs_and_lse(x, p, blocks, prefix="ref_")
        _, d_ref = _row_errors(x, p, u, "ref_", blocks)
        d = d + d_ref
        terms_x["ref_logprobs"] = ref
    grid = d.view(batch, seq)
    g, dg, loss_move = coefficient_moves(terms_x, p, logp, grid, own_reference="ref_weight" in x)
    x2 = torch.expm1(2.0 * emax.view(batch, seq))  # the relative move of every probability
    # d logits moves by |g| x2 p + dg (onehot + p (1 + x2)) <= a (onehot + p)
    a = ((g.abs() * x2 + dg * (1.0 + x2)) / p.temperature).reshape(-1)
    units = UnitSums(x, p, blocks, lse, a, x.get("bias") is not None)
    memo.state(x).setdefault(("unit-sums", repr(p), blocks), []).append(units)  # for the gradients' sweep
    return GemmAllowance(units, 2.0 * u, float(loss_move.sum()), float(emax.max()) if emax.numel() else 0.0,
                         _underflow(x, dtype))


def _underflow(x: Mapping[str, torch.Tensor], dtype: str) -> dict[str, float]:
    """Each gradient's element floor where the GEMMs flush subnormals (FLUSHED_BELOW): a d logits term
    |dz[n, v]| < t may become 0, so d weight[v, k] = sum_n dz[n, v] h[n, k] may miss by up to t sum_n
    max_k |h[n, k]|, d hidden[n, k] by t sum_v max_k |w[v, k]|, d bias[v] by t N. Found on the CPU: an
    honest float32 path (fused-torch, fp32-tiny at temperature 0.45, where whole vocabulary rows sit at
    1e-45-1e-42) missed the former floor of two subnormal steps in 3 of ~153 workload runs: 0 for
    -2.4e-44, 3.07e-43 for 3.40e-43. At seed shapes the floor is ~1e-33: no gradient a trainer can
    use lies below it."""
    t = FLUSHED_BELOW.get(dtype, 0.0)
    if not t:
        return {}
    h, w, _ = flat(x)

    def mass(m: torch.Tensor) -> float:  # sum of the rows' largest magnitudes; non-finite rows count 0
        return float(torch.nan_to_num(m.abs().amax(-1).to(torch.float64), nan=0.0, posinf=0.0).sum())

    return {"weight": t * mass(h), "hidden": t * mass(w), "bias": t * h.shape[0]}
