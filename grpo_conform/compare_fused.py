"""`GradientComparator.update` from one fused pass over the chunk (issue 35): a Triton kernel reads
`actual` (any float dtype) and `expected` (float64) once per element and leaves per-row results;
a few host steps turn them into the comparator's counts, sums, worst offenders and row sums.

Why: the torch path (`GradientComparator._update_torch`) makes ~25 full-size float64 passes per
chunk, ~250 bytes of memory traffic per element: 72 ms a judged call on a [8, 1025, 128256] gradient
on the H200, 50.8 s of the default check's 161 s (docs/timing.md, round26f). This path moves
2-4 bytes (actual) + 8 (expected) per element once, plus one float64 output row per row.

Decision: ON by default for CUDA tensors since the H200 run round29j (the default check of triton with it
on and off: the same 771 check outcomes, judge phase 29 s against 63 s; docs/timing.md);
GRPO_CONFORM_FUSED_COMPARE=0 (`compare.FUSED_ENV`) takes the torch path, which stays the reference
behaviour and the CPU's. Tests call `update_fused` directly on CPU tensors under TRITON_INTERPRET=1.

The reference values: float64 values (8 bytes an element, after the reference's ~8 float64 passes to
make them), or `FormedRows` (the judge's path on CUDA): the kernel forms coef (onehot - softmax(z / T))
itself from the scores z it is a softmax of (the operation's input rows), each row's max and sum of exp in
two passes over the row first, so the judging reads z (2 bytes in bf16) and the gradient, nothing else at
full size.

Identity with the torch path (docs/checks.md, "Fused comparison on CUDA (the default there)"):
- element allowances are computed with the torch path's operations in its order, in float64, with
  the per-row terms made on the host by the torch path's own code (`element_base`), float constants handed over as
  float64 tensors (a Python float argument would reach the kernel as float32) and the compiler's
  fusion of a*b+c into one FMA turned off (`enable_fp_fusion=False`): every element gets the same
  `allowed`, so mismatch, NaN and Inf counts and each element's score err/allowed are the same bits;
- the worst offenders: the kernel keeps each row's largest score (first column on ties); the K
  rows with the largest (row order on ties) are judged again by the torch path, one row at a time,
  and merged as the torch path merges. The global top K elements lie in those rows unless scores
  tie at the K-th place; then which tied element is kept, and the order of tied offenders, may
  differ from the torch path's (torch's topk does not specify ties either);
- row sums: the kernel sums each row in its own order. A row whose kernel sum is inside its
  allowance by more than twice the worst difference of two float64 sums (ROW_SUM_ROUNDING) passes
  in any order; every other row is summed again by the torch path (`_row_sums` on those rows), so
  failures and the worst row sum are computed by the same code as before;
- diff_sq, ref_sq, logp_sq and model_sq are sums of the same float64 terms in another order: they
  differ by float64 rounding (non-negative terms: relative < 4e-14 at V 128256), far below the
  Frobenius allowances (frobenius_rtol >= 1e-3 in every spec). max |expected| is a max: exact.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from grpo_conform.formed_rows import FormedRows

# Columns per step of a row's loop and warps per row: 2 columns per thread. Compiled for sm_90a here (no
# GPU: ptxas only), BLOCK 512 / 8 warps uses 98 registers and spills nothing (1024 / 8: 158 registers,
# 1 block per SM); not timed. benchmarks/compare_bench.py --block/--warps sweeps them on a GPU.
BLOCK = 512
NUM_WARPS = 8
_F = 8  # float64 results per row: diff_sq, ref_sq, logp_sq, max|e|, sum a, sum |a|, worst score, unused
# Any order of summing n float64 terms errs by at most (n - 1) u sum|a| (u = 2^-53): two sums differ by
# less than 2 n u sum|a|; twice that, for the rounding of sum|a| itself and a margin.
ROW_SUM_ROUNDING = 4 * 2.0**-53
_I = 4  # int32 results per row: mismatches, nan, inf, worst column
RESUM_BYTES = 256 << 20  # float64 bytes of the rows summed again at once by the torch path (`_settle`)


@triton.jit
def _scaled(z, temperature, DIVIDE_T: tl.constexpr):
    """z / T as torch divides (IEEE float64 division); at T = 1 (DIVIDE_T off) z itself, the same bits."""
    if DIVIDE_T:
        return z / temperature
    else:
        return z


@triton.jit
def _row_softmax_terms(z_ptr, width, temperature, DIVIDE_T: tl.constexpr, BLOCK: tl.constexpr):
    """(max, sum of exp(x - max)) of x = z / T over one row, in float64: torch's softmax in two passes.
    The maximum is taken over z and divided once: rounding is monotone, so for T > 0 (FormedRows checks
    it) max(z) / T is max(z / T), bit for bit, at one division a row instead of one an element."""
    offs = tl.arange(0, BLOCK)
    top = tl.full([BLOCK], float("-inf"), tl.float64)
    for c0 in range(0, width, BLOCK):
        cols = c0 + offs
        top = tl.maximum(top, tl.load(z_ptr + cols, mask=cols < width, other=float("-inf")).to(tl.float64))
    row_max = _scaled(tl.max(top, axis=0), temperature, DIVIDE_T)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for c0 in range(0, width, BLOCK):
        cols = c0 + offs
        m = cols < width
        x = _scaled(tl.load(z_ptr + cols, mask=m, other=0.0).to(tl.float64), temperature, DIVIDE_T)
        acc += tl.where(m, tl.exp(x - row_max), 0.0)
    return row_max, tl.sum(acc, axis=0)


@triton.jit
def _compare_rows(a_ptr, e_ptr, a_stride, e_stride, width, rows_ptr,
                  base_ptr, tbase_ptr, tcol_ptr, coef_ptr, den_ptr, moved_ptr, on_ptr, model_ptr, const_ptr,
                  fcoef_ptr, fcol_ptr, fout_ptr, iout_ptr,
                  HAS_TARGET: tl.constexpr, HAS_LOGP: tl.constexpr, HAS_MODEL: tl.constexpr,
                  FORMED: tl.constexpr, DIVIDE_T: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    r = tl.load(rows_ptr + pid).to(tl.int64)  # the row inside the chunk (last rows are not handed over)
    rtol = tl.load(const_ptr)
    slack = tl.load(const_ptr + 1)
    if FORMED:  # e_ptr holds the scores z: expected = coef * (onehot(target) - softmax(z / T)), formed here
        temperature = tl.load(const_ptr + 2)
        f_coef = tl.load(fcoef_ptr + pid)
        f_col = tl.load(fcol_ptr + pid)
        row_max, row_sum = _row_softmax_terms(e_ptr + r * e_stride, width, temperature, DIVIDE_T, BLOCK)
        inv_sum = 1.0 / row_sum  # one division a row: p = exp(x - max) * (1 / sum), within an ulp of torch's quotient
    base = tl.load(base_ptr + pid)  # max(atol_row_scale * s + atol, floor)
    if HAS_TARGET:
        tbase = tl.load(tbase_ptr + pid)  # max(base, target extra)
        tcol = tl.load(tcol_ptr + pid)
    if HAS_LOGP:
        coef_nz = tl.load(coef_ptr + pid) != 0
        den = tl.load(den_ptr + pid)  # |coef| clamped at 1e-300
        moved = tl.load(moved_ptr + pid)
        logp_on = tl.load(on_ptr) != 0  # some row of the chunk moves (decided on the device: no sync)
    if HAS_MODEL:
        model = tl.load(model_ptr + pid)
    offs = tl.arange(0, BLOCK)
    zero = tl.zeros([BLOCK], dtype=tl.float64)
    izero = tl.zeros([BLOCK], dtype=tl.int32)
    acc_diff, acc_ref, acc_logp, acc_max, acc_sum, acc_abs = zero, zero, zero, zero, zero, zero
    best = zero - 1.0
    best_col = izero
    n_bad, n_nan, n_inf = izero, izero, izero
    for c0 in range(0, width, BLOCK):
        cols = c0 + offs
        m = cols < width
        a = tl.load(a_ptr + r * a_stride + cols, mask=m, other=0.0).to(tl.float64)
        if FORMED:
            x = _scaled(tl.load(e_ptr + r * e_stride + cols, mask=m, other=0.0).to(tl.float64), temperature,
                        DIVIDE_T)
            p = tl.exp(x - row_max) * inv_sum
            e = tl.where(m, (tl.where(cols == f_col, 1.0, 0.0) - p) * f_coef, 0.0)  # (1 - p), (0 - p): as -p + 1, -p
        else:
            e = tl.load(e_ptr + r * e_stride + cols, mask=m, other=0.0).to(tl.float64)
        e_abs = tl.abs(e)
        element_abs = zero + base
        if HAS_TARGET:
            element_abs = tl.where(cols == tcol, tbase, element_abs)
        if HAS_LOGP:
            q = e_abs / den
            share = tl.where(coef_nz, tl.where(q > 1.0, 1.0, q), 1.0)  # clamp_max(1): NaN stays NaN
            extra = moved * share
            extra = tl.where(logp_on, extra, 0.0)  # off: + 0.0 leaves every allowance's bits as they were
            element_abs = element_abs + extra
            acc_logp += tl.where(m, extra * extra, 0.0)
        if HAS_MODEL:
            element_abs = element_abs + model
        allowed = (rtol * e_abs + element_abs) * slack
        diff = a - e
        err = tl.abs(diff)
        is_nan = a != a
        is_inf = tl.abs(a) == float("inf")
        finite = (~is_nan) & (~is_inf)
        bad = (~(err <= allowed)) & m
        n_bad += bad.to(tl.int32)
        n_nan += (is_nan & m).to(tl.int32)
        n_inf += (is_inf & m).to(tl.int32)
        d = tl.where(finite & m, diff, 0.0)
        acc_diff += d * d
        acc_ref += e * e
        acc_max = tl.maximum(acc_max, e_abs)
        acc_sum += a
        acc_abs += tl.abs(a)
        if tl.max(bad.to(tl.int32), axis=0) > 0:  # the scores (a division each) only in a step with a mismatch
            den_allowed = tl.where(allowed < 1e-300, 1e-300, allowed)  # clamp_min: NaN stays NaN
            score = tl.where(finite, err / den_allowed, float("inf"))
            score = tl.where(bad, tl.where(score != score, float("inf"), score), -1.0)  # NaN ranks first, as in topk
            better = score > best  # strict: a lane keeps its first column on ties
            best = tl.where(better, score, best)
            best_col = tl.where(better, cols, best_col)
    worst = tl.max(best, axis=0)
    worst_col = tl.min(tl.where(best == worst, best_col, 2147483647), axis=0)
    fo = fout_ptr + pid * 8
    tl.store(fo, tl.sum(acc_diff, axis=0))
    tl.store(fo + 1, tl.sum(acc_ref, axis=0))
    tl.store(fo + 2, tl.sum(acc_logp, axis=0))
    tl.store(fo + 3, tl.max(acc_max, axis=0))
    tl.store(fo + 4, tl.sum(acc_sum, axis=0))
    tl.store(fo + 5, tl.sum(acc_abs, axis=0))
    tl.store(fo + 6, worst)
    io = iout_ptr + pid * 4
    tl.store(io, tl.sum(n_bad, axis=0))
    tl.store(io + 1, tl.sum(n_nan, axis=0))
    tl.store(io + 2, tl.sum(n_inf, axis=0))
    tl.store(io + 3, worst_col)


def launch_options() -> dict:
    """No FMA contraction: torch rounds a*b and then + c; one fused rounding would move `allowed`."""
    return {"num_warps": NUM_WARPS, "enable_fp_fusion": False}


def row_stats(actual: torch.Tensor, expected: torch.Tensor, keep: torch.Tensor, base: torch.Tensor,
              rtol: float, slack: float, target: tuple[torch.Tensor, torch.Tensor] | None = None,
              logp: tuple[torch.Tensor, torch.Tensor] | None = None, model: torch.Tensor | None = None,
              block: int | None = None, logp_on: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel over rows `keep` (int indices into the chunk) of actual [rows, width] and expected.
    Per-row arguments are float64 [len(keep)]: base = the element allowance before the log-prob and
    model terms; target = (column, max(base, extra)), -1 where none; logp = (coef, moved); model.
    logp_on: a one-element tensor, nonzero where the log-prob term applies (default: it does).
    `expected`: float64 values, or FormedRows (the kernel forms the values from its scores z).
    Returns (float64 [len(keep), 8], int32 [len(keep), 4]) in the order the kernel writes them."""
    if actual.dim() != 2 or expected.shape != actual.shape:
        raise ValueError(f"fused comparison: actual {tuple(actual.shape)} and expected {tuple(expected.shape)}"
                         " must be the same [rows, width]")
    actual = actual if actual.stride(1) == 1 else actual.contiguous()  # the kernel steps along a row by 1
    formed = expected if isinstance(expected, FormedRows) else None
    if formed is not None and not formed.temperature > 0:  # the row maximum's one division assumes it
        raise ValueError(f"fused comparison: the formed rows' temperature is {formed.temperature}, expected > 0")
    values = formed.z if formed is not None else expected
    values = values if values.stride(1) == 1 else values.contiguous()
    n, dev = keep.numel(), actual.device
    f64 = dict(dtype=torch.float64, device=dev)
    fout = torch.empty((n, _F), **f64)
    iout = torch.empty((n, _I), dtype=torch.int32, device=dev)
    if n == 0:
        return fout, iout
    dummy = torch.zeros(1, **f64)
    tcol, tbase = (dummy.to(torch.int32), dummy) if target is None else (target[0].to(torch.int32).contiguous(),
                                                                        target[1].contiguous())
    coef, moved = (dummy, dummy) if logp is None else (logp[0].contiguous(), logp[1].contiguous())
    den = coef.abs().clamp_min(1e-300)  # as the torch path clamps |coef|
    consts = _constants((rtol, slack, formed.temperature if formed is not None else 1.0), dev)
    on = torch.ones(1, dtype=torch.int32, device=dev) if logp_on is None else logp_on.to(torch.int32).reshape(1)
    fcoef, fcol = (dummy, dummy.to(torch.int32)) if formed is None else (
        formed.coef.to(torch.float64)[keep].contiguous(), formed.target[keep].to(torch.int32).contiguous())
    _compare_rows[(n,)](actual, values, actual.stride(0), values.stride(0), actual.shape[1],
                        keep.to(torch.int32).contiguous(), base.contiguous(), tbase, tcol, coef, den, moved, on,
                        dummy if model is None else model.contiguous(), consts, fcoef, fcol, fout, iout,
                        HAS_TARGET=target is not None, HAS_LOGP=logp is not None, HAS_MODEL=model is not None,
                        FORMED=formed is not None, DIVIDE_T=formed is not None and formed.temperature != 1.0,
                        BLOCK=block or BLOCK, **launch_options())
    return fout, iout


_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _constants(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The kernel's float64 constants as a device tensor, made once per value and device: torch.tensor(...,
    device=cuda) copies from pageable host memory and waits for the stream, which made the host wait for the
    GPU at every chunk (763 of a mask-b8 workload's waits on the H200, round31b's profile)."""
    key = (values, str(device))
    found = _CONSTANTS.get(key)
    if found is None:
        if len(_CONSTANTS) > 256:  # tolerances and temperatures of one run: a handful; bound it anyway
            _CONSTANTS.clear()
        found = _CONSTANTS[key] = torch.tensor(values, dtype=torch.float64, device=device)
    return found


def _first_last(start: int, seq_next: int) -> int:
    """The index inside a chunk starting at row `start` of its first last row (row % seq_next == seq_next - 1)."""
    return (seq_next - 1 - start % seq_next) % seq_next


def kept_rows(start: int, n: int, seq_next: int | None, device) -> torch.Tensor:
    """Indices into a chunk of rows [start, start + n) of the rows that are not last rows (row % seq_next
    == seq_next - 1), formed on the device from host integers: no nonzero(), which waits for the GPU."""
    j = torch.arange(n - last_count(start, n, seq_next), device=device)
    if seq_next is None or seq_next < 2:
        return j  # (seq_next 1: every row is last, and n - count is 0)
    first = _first_last(start, seq_next)
    past = torch.clamp(j - first, min=0)  # kept rows after it skip one last row per seq_next - 1 of them
    return torch.where(j < first, j, first + 1 + past + past // (seq_next - 1))


def last_count(start: int, n: int, seq_next: int | None) -> int:
    """How many of rows [start, start + n) are last rows."""
    if seq_next is None or n <= 0:
        return 0
    return (start + n) // seq_next - start // seq_next


def update_fused(cmp, start: int, actual: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor,
                 floor: torch.Tensor | None = None, target: tuple[torch.Tensor, torch.Tensor] | None = None,
                 logp: tuple[torch.Tensor, torch.Tensor] | None = None, model: torch.Tensor | None = None,
                 *, top_k: int, block: int | None = None) -> None:
    """`cmp.update(...)` (a `GradientComparator`; same arguments) from the fused kernel; `top_k` is
    compare.TOP_K (handed over: this module does not import compare, tests/test_import_graph.py).

    One read of the device per chunk (this function's first version waited on it 19 times: 51 ms a judged
    call on the H200 with the kernel at 0.47 ms, docs/timing.md): which rows are last rows, and which
    are kept, is index arithmetic on host integers, whether the log-prob term applies is decided on the
    device, and every count and sum comes back in one `.tolist()`. What stays conditional on that read
    is the rare work: offenders, rows to sum again, a last row that is not zero."""
    update_fused_many(cmp, [(start, actual, expected, scale, floor, target, logp, model)], top_k=top_k, block=block)


def update_fused_many(cmp, chunks, *, top_k: int, block: int | None = None) -> None:
    """`update_fused` for several chunks (tuples of its positional arguments, in row order): every
    chunk's kernel is queued first and all their results come back in one read, then each chunk is
    settled in order, as one call per chunk would (the GPU is not left idle while the host handles a
    chunk). Each chunk's tensors are held until then: chunks with formed reference values (FormedRows)
    hold views only."""
    pending = [_launch(cmp, *chunk, block=block) for chunk in chunks]
    vectors = [p.parts for p in pending if p.parts is not None]
    if not vectors:
        return
    got = torch.cat(vectors).tolist()  # the one wait for the device
    at = 0
    for p in pending:
        if p.parts is not None:
            _settle(cmp, p, got[at : at + p.parts.numel()], top_k)
            at += p.parts.numel()


@dataclasses.dataclass
class _Pending:
    """One chunk whose kernel is queued: what `_settle` needs once its results are read."""

    args: tuple  # (start, actual, expected, scale, floor, target, logp, model)
    idx: torch.Tensor
    n_keep: int
    s: torch.Tensor | None = None
    fl: torch.Tensor | None = None
    lp: tuple | None = None
    md: torch.Tensor | None = None
    fout: torch.Tensor | None = None
    iout: torch.Tensor | None = None
    again: torch.Tensor | None = None
    last: torch.Tensor | None = None
    parts: torch.Tensor | None = None  # everything the comparator adds, one float64 vector


def _launch(cmp, start, actual, expected, scale, floor=None, target=None, logp=None, model=None, *,
            block: int | None = None) -> _Pending:
    f64 = torch.float64
    n, width = actual.shape
    dev = actual.device
    n_last = last_count(start, n, cmp.seq_next)
    p = _Pending((start, actual, expected, scale, floor, target, logp, model), kept_rows(start, n, cmp.seq_next, dev),
                 n - n_last)
    if n_last:  # 1/seq_next of the rows: counted here, handed to the torch path's code only when not zero
        # their indices by arithmetic: a boolean mask index would count its True entries on the host
        p.last = torch.arange(n_last, device=dev) * cmp.seq_next + _first_last(start, cmp.seq_next)
    parts = []  # everything the comparator adds, in one float64 vector (counts are exact below 2^53)
    if p.n_keep:
        idx = p.idx
        p.s = scale.to(f64)[idx]
        p.fl = None if floor is None else floor.to(f64)[idx]
        absolute, base = cmp.element_base(p.s, p.fl)  # the torch path's per-row terms, its own code
        tgt = None
        if target is not None:
            cols = target[0][idx]
            tbase = torch.maximum(base, target[1].to(f64)[idx])
            tgt = (torch.where(cols >= 0, cols, torch.full_like(cols, -1)), tbase)
        on = None
        if logp is not None:
            coef, moved = logp[0].to(f64)[idx], logp[1].to(f64)[idx]
            p.lp = (coef, moved)
            on = (moved > 0).any()  # as the torch path: no log-prob term unless a row moves
        p.md = None if model is None else model.to(f64)[idx]
        p.fout, p.iout = row_stats(actual, expected, idx, base, cmp.tol.element_rtol, cmp.slack, tgt, p.lp, p.md,
                                   block, logp_on=on)
        parts += [p.iout[:, :3].to(torch.int64).sum(dim=0).to(f64), p.fout[:, :3].sum(dim=0),
                  (absolute * absolute).sum().reshape(1), p.fout[:, 3].max().reshape(1)]
        if p.md is not None:
            parts.append((p.md * p.md).sum().reshape(1))
        if cmp.row_sums:
            allowed = cmp.row_sum_allowed(p.s, p.fl, width)
            margin = ROW_SUM_ROUNDING * width * p.fout[:, 5]  # how far two float64 sums of the row may differ
            p.again = ~((p.fout[:, 4].abs() + margin) < allowed)  # True for NaN/Inf sums and allowances
            parts.append(p.again.sum().to(f64).reshape(1))
    if p.last is not None:
        parts.append((actual.index_select(0, p.last) != 0).sum().to(f64).reshape(1))  # NaN != 0 counts too
    p.parts = torch.cat(parts) if parts else None
    return p


def _settle(cmp, p: _Pending, got: list[float], top_k: int) -> None:
    """Adds one chunk's read results to the comparator; the rare work (offenders, rows to sum again, a
    last row that is not zero) by the torch path's own code."""
    f64 = torch.float64
    start, actual, expected, scale, floor, target, logp, model = p.args
    width = actual.shape[1]
    if p.n_keep:
        counts, sums, atol_sum, max_ref = got[0:3], got[3:6], got[6], got[7]
        k = 8
        cmp.elements += p.n_keep * width
        cmp.mismatches += int(counts[0])
        cmp.nan += int(counts[1])
        cmp.inf += int(counts[2])
        cmp.diff_sq += sums[0]
        cmp.ref_sq += sums[1]
        cmp.atol_sq += atol_sum * width
        if p.lp is not None:
            cmp.logp_sq += sums[2]  # 0.0 where no row moves: the torch path adds nothing then
        if p.md is not None:
            cmp.model_sq += got[k] * width  # width equal terms per row
            k += 1
        cmp.max_abs_ref = max(cmp.max_abs_ref, max_ref)
        if counts[0]:
            _worst_rows(cmp, start, p.idx, p.fout[:, 6], p.iout[:, 0], actual, expected, scale, floor, target, logp,
                        model, top_k)
        if p.again is not None:
            if got[k]:
                r_again = torch.nonzero(p.again).squeeze(1)
                per = max(1, RESUM_BYTES // (8 * width))  # a chunk without values can span 2^15 rows
                for lo in range(0, r_again.numel(), per):
                    ra = r_again[lo : lo + per]
                    r = p.idx[ra]
                    cmp._row_sums(start + r, actual[r].to(f64), p.s[ra], None if p.fl is None else p.fl[ra])
            k += 1
    if p.last is not None and got[-1]:
        cmp._last_rows(start + p.last, actual[p.last].to(f64))  # the torch path's code: it counts them itself


def _worst_rows(cmp, start, idx, worst, bad, actual, expected, scale, floor, target, logp, model, top_k) -> None:
    """The offenders: the rows with the top_k largest row scores (row order on ties), each judged again
    by the torch path alone (a scratch comparator), merged into cmp.worst as the torch path merges."""
    order = torch.argsort(-worst, stable=True)
    order = order[bad[order] > 0][:top_k]
    chosen = sorted(int(i) for i in idx[order].tolist())
    scratch = dataclasses.replace(cmp, worst=[], row_sums=False)
    found = []
    for r in chosen:
        one = slice(r, r + 1)
        scratch.worst = []
        rows = expected.rows(one).dense() if isinstance(expected, FormedRows) else expected[one]
        scratch._update_torch(start + r, actual[one], rows, scale[one],
                              None if floor is None else floor[one],
                              None if target is None else (target[0][one], target[1][one]),
                              None if logp is None else (logp[0][one], logp[1][one]),
                              None if model is None else model[one])
        found.extend(scratch.worst)
    cmp.worst = sorted(cmp.worst + sorted(found, key=lambda p: -p[0])[:top_k], key=lambda p: -p[0])[:top_k]
