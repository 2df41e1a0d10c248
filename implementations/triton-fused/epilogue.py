"""The forward-only call's logits GEMM with the row statistics in its epilogue (FusedSettings.forward_gemm =
"epilogue"): the logits are never written or read back (docs/fused-kernel.md, "The epilogue forward").

A persistent Triton GEMM (one program per SM, operands through TMA descriptors) makes each (BM x BN) tile of
y = hidden @ weight.T (+ bias) in float32 and leaves, per row of the tile, the tile's max of y and
sum of exp((y - max) / T), and the target logit y[target] where the row's target column lies in the tile.
A combine kernel (one program per row) folds a row's tiles into the row's (max, ln S, target logit), the
triple the loss kernels read under GIVEN + TARGET_GIVEN (kernels.py), or, LOGP_ONLY, into the row's
log-prob (the reference model's, through its own lm_head). Masked rows are combined to zeros, never read.

Where it runs (`why_not`): CUDA on sm_90+ (TMA) or the interpreter (the CPU tiers, tl.dot upcast: the
interpreter multiplies bf16 bit patterns, triton-lang/triton#11584), bf16/fp16 operands (float32 ones
would run as tf32), rows on 16-byte boundaries, and at most forward_epilogue_rows rows (above that cuBLAS
and the staged sweep measured faster; docs/fused-kernel.md). Elsewhere the staged or pipelined sweep runs.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .accumulator import interpreting

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tile_of(tile, M, V, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, vocabulary block) of a tile number: GROUP_M row blocks walked together per weight tile,
    so a weight tile is read from DRAM once per group while the group's hidden rows stay in L2."""
    num_n = tl.cdiv(V, BN)
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    size_m = tl.minimum(tl.cdiv(M, BM) - first_m, GROUP_M)
    return first_m + (tile % per_group) % size_m, (tile % per_group) // size_m


@triton.jit
def _tile_partials(y, pid_m, pid_n, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, NT, scale2, BM: tl.constexpr,
                   BN: tl.constexpr):
    """One tile's logits y [BM, BN] (float32, bias added) -> per row: max of y and sum of 2^((y - max) *
    scale2) at column pid_n of the partials; the target logit of each row whose target lies in the tile."""
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    row_ok = rows < M
    y = tl.where((cols < V)[None, :], y, float("-inf"))
    mx = tl.max(y, 1)
    s = tl.sum(tl.exp2((y - mx[:, None]) * scale2), 1)
    at = tl.cast(rows, tl.int64) * NT + pid_n
    tl.store(pmax_ptr + at, mx, mask=row_ok)
    tl.store(psum_ptr + at, s, mask=row_ok)
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=-1)
    mine = row_ok & (ids >= pid_n * BN) & (ids < pid_n * BN + BN)
    t = tl.sum(tl.where(cols[None, :] == ids[:, None], y, 0.0), 1)
    tl.store(tgt_ptr + rows, t, mask=mine)


@triton.jit
def _epilogue_gemm_kernel(a_desc, b_desc, bias_ptr, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, K, NT, scale2,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                          PROGRAMS: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
    """Persistent: PROGRAMS programs walk the tiles in turn; TMA pads rows past M, columns past V and the
    inner dimension past K with zeros (the epilogue masks the columns, the stores the rows)."""
    tiles = tl.cdiv(M, BM) * tl.cdiv(V, BN)
    for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_of(tile, M, V, BM, BN, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BK)):
            a = a_desc.load([pid_m * BM, ki * BK])
            b = b_desc.load([pid_n * BN, ki * BK])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc)
        if HAS_BIAS:
            cols = pid_n * BN + tl.arange(0, BN)
            acc += tl.load(bias_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)[None, :]
        _tile_partials(acc, pid_m, pid_n, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, NT, scale2, BM, BN)


@triton.jit
def _epilogue_combine_kernel(pmax_ptr, psum_ptr, tgt_ptr, mask_ptr, out_ptr, stride_out, NT, scale2, inv_temp, inv_lo,
                             BLOCK: tl.constexpr, HAS_MASK: tl.constexpr, LOGP_ONLY: tl.constexpr):
    """Row r: out[r] = max, out[stride_out + r] = ln S, out[2 stride_out + r] = the target logit; LOGP_ONLY:
    out[r] = the row's log-prob (formed in float64, as kernels._stats_kernel forms it). Masked rows: zeros."""
    r = tl.program_id(0)
    live = True
    if HAS_MASK:
        live = tl.load(mask_ptr + r) != 0
    m = tl.full([], 0.0, tl.float32)
    log_s = m
    x_c = m
    if live:
        i = tl.arange(0, BLOCK)
        ok = i < NT
        at = tl.cast(r, tl.int64) * NT + i
        mt = tl.load(pmax_ptr + at, mask=ok, other=float("-inf"))
        st = tl.load(psum_ptr + at, mask=ok, other=0.0)
        m = tl.max(mt, 0)
        log_s = tl.log2(tl.sum(st * tl.exp2((mt - m) * scale2), 0)) * LN2
        x_c = tl.load(tgt_ptr + r)
    if LOGP_ONLY:
        inv64 = (tl.full([], 0.0, tl.float64) + inv_temp) + inv_lo
        logp = ((x_c.to(tl.float64) - m.to(tl.float64)) * inv64 - log_s.to(tl.float64)).to(tl.float32)
        tl.store(out_ptr + r, tl.where(live, logp, 0.0))
    else:
        tl.store(out_ptr + r, m)
        tl.store(out_ptr + stride_out + r, log_s)
        tl.store(out_ptr + 2 * stride_out + r, x_c)


def why_not(device: torch.device, rows: int, hidden: int, dtype: torch.dtype, settings) -> Optional[str]:
    """None where the epilogue GEMM can run this plan's forward-only calls, else the reason."""
    if settings.forward_gemm != "epilogue":
        return f"forward_gemm is {settings.forward_gemm!r}"
    if rows > settings.forward_epilogue_rows:
        return f"{rows} rows, over forward_epilogue_rows ({settings.forward_epilogue_rows}): cuBLAS and the sweep"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"{dtype} operands (tl.dot would run float32 as tf32)"
    if (hidden * 2) % 16:
        return f"hidden rows of {hidden} x 2 bytes do not start on 16-byte boundaries (TMA)"
    if interpreting():
        return None
    if device.type != "cuda":
        return "not a CUDA device"
    if torch.cuda.get_device_capability(device)[0] < 9:
        return "no TMA before sm_90"
    return None


def _aligned(*tensors: Optional[torch.Tensor]) -> bool:
    return all(t is None or (t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0)
               for t in tensors)


class EpilogueStats:
    """One plan's epilogue GEMM: tile shape and the partials for up to `rows` rows, kept across calls."""

    def __init__(self, rows: int, vocab: int, hidden: int, device: torch.device, settings, inv_temp: float,
                 inv_lo: float):
        bm, bn, bk, self.stages, warps = settings.forward_epilogue_tile
        self.bm = max(16, min(bm, triton.next_power_of_2(rows)))
        self.bn = max(16, min(bn, triton.next_power_of_2(vocab)))
        self.bk = max(16, min(bk, triton.next_power_of_2(hidden)))
        self.warps = warps if self.bm * self.bn >= 128 * 128 else 4
        self.vocab, self.hidden = vocab, hidden
        self.nt = triton.cdiv(vocab, self.bn)
        self.group = triton.cdiv(rows, self.bm)  # every row block per weight tile: the weight is read once
        tiles = self.group * self.nt
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.programs = max(1, min(sms, tiles))
        self.scale2, self.inv_temp, self.inv_lo = LOG2E * inv_temp, inv_temp, inv_lo
        self.pmax = torch.empty(rows * self.nt, dtype=torch.float32, device=device)
        self.psum = torch.empty_like(self.pmax)
        self.tgt = torch.empty(rows, dtype=torch.float32, device=device)

    def usable(self, h: torch.Tensor, w: torch.Tensor) -> bool:
        """The call's operands as TMA needs them (an offset view may start off 16 bytes)."""
        return _aligned(h, w)

    def run(self, h, w, bias, ids, mask, out: torch.Tensor, stride_out: int, logp_only: bool) -> None:
        """Rows of h: (max, ln S, target logit) into out's three sections stride_out apart, or the log-prob
        into out (logp_only)."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        m = h.shape[0]
        a_desc = TensorDescriptor.from_tensor(h, [self.bm, self.bk])
        b_desc = TensorDescriptor.from_tensor(w, [self.bn, self.bk])
        _epilogue_gemm_kernel[(self.programs,)](
            a_desc, b_desc, bias if bias is not None else self.tgt, ids, self.pmax, self.psum, self.tgt, m, self.vocab,
            self.hidden, self.nt, self.scale2, BM=self.bm, BN=self.bn, BK=self.bk, GROUP_M=self.group,
            PROGRAMS=self.programs, HAS_BIAS=bias is not None, UPCAST=interpreting(), num_stages=self.stages,
            num_warps=self.warps)
        _epilogue_combine_kernel[(m,)](self.pmax, self.psum, self.tgt, mask if mask is not None else ids, out,
                                       stride_out, self.nt, self.scale2, self.inv_temp, self.inv_lo,
                                       BLOCK=triton.next_power_of_2(self.nt), HAS_MASK=mask is not None,
                                       LOGP_ONLY=logp_only, num_warps=4)
