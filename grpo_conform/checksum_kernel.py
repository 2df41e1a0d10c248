"""The Triton pass of `checksum.keyed_checksum`: each program sums one block of bytes, weighted by
position (the formula is in grpo_conform/checksum.py); the host adds the block sums on the device."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _block_sums_kernel(raw_ptr, n, offset, k1, k2, out_ptr, MOD: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    local = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = local < n
    b = tl.load(raw_ptr + local, mask=inside, other=0).to(tl.int64)
    pos = local + offset
    weight = ((pos % MOD) * k1 + k2) % MOD + 1  # non-negative operands: the remainder is torch's
    tl.store(out_ptr + pid, tl.sum(b * weight, axis=0))


def block_sums(raw: torch.Tensor, offset: int, k1: int, k2: int, block: int, modulus: int) -> torch.Tensor:
    """int64 [ceil(n / block)]: the weighted sum of each block of uint8 `raw` (first byte at `offset`)."""
    n = raw.numel()
    out = torch.empty(triton.cdiv(n, block), dtype=torch.int64, device=raw.device)
    # the arithmetic is int64 whatever type Triton gives the int arguments: `local` is int64
    _block_sums_kernel[(out.numel(),)](raw, n, offset, k1, k2, out, MOD=modulus, BLOCK=block)
    return out
