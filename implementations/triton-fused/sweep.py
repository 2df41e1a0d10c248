"""The staged statistics sweep of forward-only calls (FusedSettings.forward_sweep = "staged"): where it runs,
its launch shape, and its launch; CUDA only (staged.py is Gluon).

A forward-only call reads the logits once beyond the GEMM. The plain Triton sweeps of kernels.py run one
program per row with a few KB in flight; the staged kernel cuts each row into ~32 KB chunks, one program
each, every copy of a chunk in flight at once (the statistics pass of implementations/triton, whose
shapes these are: launch.GPU_DEFAULT's forward_stage_bytes, forward_block, forward_stage_warps). It writes
each live row's (max, ln S); the loss kernels then read those instead of sweeping (kernels.py, GIVEN).

Where it cannot run, the plan keeps the pipelined sweep (`why_not` says why): not CUDA or the
interpreter, rows off 16-byte boundaries (its copies are 16-byte pieces), or a Gluon that does not compile
it (caught before anything ran on the device; staging then stays off for the process, `DISABLED` says
why). Slower, never wrong.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import triton

from .accumulator import interpreting

LOG2E = 1.4426950408889634
DISABLED: list[str] = []  # why staging was switched off in this process, if it was


def why_not(device: torch.device, vocab: int, dtype: torch.dtype, settings) -> Optional[str]:
    """None where the staged sweep can run these forward-only calls, else the reason."""
    if settings.forward_sweep != "staged":
        return f"forward_sweep is {settings.forward_sweep!r}"
    if device.type != "cuda" or interpreting():
        return "not a CUDA device (Gluon does not run under the interpreter)"
    size = torch.tensor([], dtype=dtype).element_size()
    if (vocab * size) % 16:
        return f"rows of {vocab} x {size} bytes do not start on 16-byte boundaries"
    if DISABLED:
        return DISABLED[0]
    return None


class StagedStats:
    """One plan's staged sweep: launch shape, partials and arrival counters for chunks of up to `rows` rows."""

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device, settings, inv_temp: float):
        size = torch.tensor([], dtype=dtype).element_size()
        vec = 16 // size
        tile = 32 * settings.forward_stage_warps * vec  # one 16-byte piece per thread
        block = tile * triton.next_power_of_2(max(1, settings.forward_stage_block // tile) + 1) // 2
        chunk = max(block, settings.forward_stage_bytes // size // block * block)  # whole blocks
        chunk = min(chunk, triton.cdiv(vocab, block) * block)  # no block that is padding only
        n = triton.cdiv(vocab, chunk)
        self.shape = dict(CHUNK=chunk, BLOCK=block, NUM_CHUNKS=n, CHUNKS_P2=triton.next_power_of_2(n), VEC=vec)
        self.warps, self.vocab, self.scale2 = settings.forward_stage_warps, vocab, LOG2E * inv_temp
        self.m_part = torch.empty(rows * n, dtype=torch.float32, device=device)
        self.s_part = torch.empty(rows * n, dtype=torch.float32, device=device)
        self.counts = torch.zeros(rows, dtype=torch.int32, device=device)  # never reset: staged.py

    def run(self, buf: torch.Tensor, mask: Optional[torch.Tensor], st: torch.Tensor, row0: int, stride_st: int) -> bool:
        """st[r] = max, st[stride_st + r] = ln S of every live row r of buf (token row0 + r); False where the
        kernel did not compile (then nothing ran)."""
        rows = buf.shape[0]
        try:
            from . import staged

            staged._staged_row_stats_kernel[(rows * self.shape["NUM_CHUNKS"],)](
                buf, buf if mask is None else mask, st, self.m_part, self.s_part, self.counts, row0, buf.stride(0),
                stride_st, self.vocab, self.scale2, **self.shape, THREAD_STATS=True, HAS_MASK=mask is not None,
                num_warps=self.warps)
            return True
        except Exception as exc:  # compile time only: nothing reached the device
            DISABLED.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            warnings.warn(f"grpo-conform triton-fused: the staged sweep is off, the pipelined one runs ({DISABLED[-1]})")
            return False
