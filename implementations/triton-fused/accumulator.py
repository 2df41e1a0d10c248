"""d weight's float32 accumulators (docs/fused-kernel.md, "Weight gradient"): each chunk adds d logits_c^T @
hidden_c into float32, so the sum over chunks is rounded to the weight's dtype once, at the end.

  Fp32      one V x H float32 buffer beside the returned gradient: 4 V H bytes extra.
  Halves    the same float32 sums, half of them kept in the returned gradient's own bytes: a V x H
            gradient in a 2-byte dtype has exactly the bytes of V/2 x H float32 values, so rows
            [0, V/2) accumulate there (viewed as float32), rows [V/2, V) in a buffer of their own
            (2 V H bytes extra, half of Fp32's). At the end the first half is narrowed in place
            (`narrow_in_place`) and the second copied in. Same GEMMs, same float32 sums and the same
            accumulator traffic per chunk as Fp32; the returned tensor owns exactly V H 2 bytes (no
            oversized storage behind it).

`accumulate_fp32` is the GEMM both use: cuBLAS where torch's addmm takes a float32 C with bf16 operands,
else the Triton kernel `kernels._acc_gemm_kernel`.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton

from . import kernels

_CUBLAS_ACCUMULATES: dict = {}  # device -> whether torch's addmm takes a float32 C with bf16 operands


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def accumulate_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, path: str = "auto") -> str:
    """acc += a @ b with float32 accumulation into the float32 acc; returns the path taken. cuBLAS where
    torch's addmm(out_dtype=float32) accepts a float32 C with bf16 operands (some versions require C in
    the operands' dtype), else the Triton GEMM `_acc_gemm_kernel`; on the CPU float32 copies of the
    operands. `path` forces "cublas" or "triton" (the benchmark compares them)."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
        return "same-dtype"
    if not a.is_cuda:
        if path == "triton":
            return _triton_accumulate(acc, a, b, (16, 16, 16, 4, 1, 1))
        acc.addmm_(a.float(), b.float())  # copies of both operands in float32
        return "upcast"
    if path in ("auto", "cublas") and _CUBLAS_ACCUMULATES.get(a.device, True):
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)  # cuBLAS: bf16 operands, fp32 C
            _CUBLAS_ACCUMULATES[a.device] = True
            return "cublas"
        except (RuntimeError, TypeError):
            _CUBLAS_ACCUMULATES[a.device] = False
            if path == "cublas":
                raise
    return _triton_accumulate(acc, a, b, (128, 256, 64, 8, 3, 8))


def _triton_accumulate(acc, a, b, config) -> str:
    bm, bn, bk, warps, stages, group = config
    m, k = a.shape
    n = b.shape[1]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    kernels._acc_gemm_kernel[grid](a, b, acc, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                   acc.stride(0), acc.stride(1), BM=bm, BN=bn, BK=bk, GROUP_M=group, UPCAST=interpreting(),
                                   num_warps=warps, num_stages=stages)
    return "triton"


def narrow_in_place(flat: torch.Tensor, n: int) -> None:
    """flat[:n] = flat.view(float32)[:n] rounded to flat's 2-byte dtype, in the same bytes.

    Value i is read from bytes [4i, 4i + 4) and written to [2i, 2i + 2). A copy of [s, e) with e <= 2s
    writes [2s, 2e), below the bytes it reads ([4s, 4e)), over values [s/2, e/2) that earlier copies
    already read: so blocks double from a first one that goes through a small temporary, each block one
    copy, in stream order."""
    wide = flat.view(torch.float32)
    if n <= 0:
        return
    first = min(n, 1 << 20, max(1, n // 8))
    flat[:first].copy_(wide[:first].to(flat.dtype))
    s = first
    while s < n:
        e = min(n, 2 * s)
        flat[s:e].copy_(wide[s:e])
        s = e


class Fp32:
    """d weight in one V x H float32 buffer (a float32 weight's gradient is the buffer itself)."""

    @staticmethod
    def extra_bytes(vocab: int, hidden: int, dtype: torch.dtype) -> int:
        """The float32 buffer, unless it is the returned gradient itself (float32 weights)."""
        return 0 if dtype == torch.float32 else vocab * hidden * 4

    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device):
        self.dtype = dtype
        self.acc = torch.zeros(vocab, hidden, dtype=torch.float32, device=device)

    def add(self, dlogits: torch.Tensor, h: torch.Tensor, path: str) -> str:
        return accumulate_fp32(self.acc, dlogits.t(), h, path)

    def finish(self) -> torch.Tensor:
        return self.acc if self.dtype == torch.float32 else self.acc.to(self.dtype)


class Halves:
    """d weight's float32 sums, rows [0, V/2) in the returned gradient's bytes (module docstring).

    The static rules (`fits`, `low_rows`, `extra_bytes`) are the plan's too (plan.FusedPlan chooses the
    strategy and counts its memory with them), so the rule and the buffers cannot drift apart."""

    @staticmethod
    def fits(vocab: int, hidden: int, dtype: torch.dtype) -> bool:
        """Whether a V x H gradient of dtype has the bytes of V H / 2 float32 values (2-byte dtype, even V H)."""
        return torch.tensor([], dtype=dtype).element_size() == 2 and (vocab * hidden) % 2 == 0

    @staticmethod
    def low_rows(vocab: int) -> int:
        """Rows [0, low_rows) accumulate inside the gradient: V/2 rounded down to 8 rows, so that cuBLAS sees
        16-byte aligned operand views."""
        return (vocab // 2) // 8 * 8

    @staticmethod
    def extra_bytes(vocab: int, hidden: int) -> int:
        """The float32 buffer of rows [low_rows, V): the only bytes beyond the returned gradient."""
        return (vocab - Halves.low_rows(vocab)) * hidden * 4

    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device):
        if not Halves.fits(vocab, hidden, dtype):
            raise ValueError(f"the halves accumulator needs a 2-byte dtype and an even V x H; got {dtype}, {vocab} x {hidden}")
        self.vocab, self.hidden = vocab, hidden
        self.out = torch.empty(vocab * hidden, dtype=dtype, device=device)
        self.cut = Halves.low_rows(vocab)
        self.low = self.out.view(torch.float32)[: self.cut * hidden].view(self.cut, hidden).zero_()
        self.high = torch.zeros(vocab - self.cut, hidden, dtype=torch.float32, device=device)

    def add(self, dlogits: torch.Tensor, h: torch.Tensor, path: str) -> str:
        if self.cut:
            accumulate_fp32(self.low, dlogits[:, : self.cut].t(), h, path)
        return accumulate_fp32(self.high, dlogits[:, self.cut:].t(), h, path)

    def finish(self) -> torch.Tensor:
        n = self.cut * self.hidden
        narrow_in_place(self.out, n)
        self.out[n:].copy_(self.high.view(-1))
        self.high = self.low = None
        return self.out.view(self.vocab, self.hidden)


def accumulator(strategy: str, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device) -> Optional[object]:
    """The accumulator of a strategy ("fp32" or "halves"); None for "hold" (d logits are kept instead)."""
    return {"fp32": Fp32, "halves": Halves}.get(strategy, lambda *a: None)(vocab, hidden, dtype, device)
