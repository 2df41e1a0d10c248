"""A keyed checksum of tensors' bytes: how the conformance run sees whether a kept output changed
(`WorkloadConformance.fingerprint`, the `no-output-reuse` check).

checksum = sum over every byte b at position i (the tensors' bytes one after another) of
b * (((i * k1 + k2) mod 65521) + 1), in int64, computed as ((i mod 65521) * k1 + k2) mod 65521 so that
no product passes 2^47 (k1, k2 < 2^31). Each term is below 2^24, so with fewer than 2^39 bytes the sum
is exact, so the same bytes give the same integer in any order of summation, on the
CPU (torch, in slices) and on CUDA (one Triton pass). Every weight is 1..65521, never 0: any one changed
byte changes the sum; a change that keeps it needs the key, which never leaves the parent.

Why a kernel on CUDA: the float64 version before (each byte to float64, an arange, a remainder, a
product and a sum: ~7 float64 passes) took ~100 ms for a 2 GB gradient on the H200, 17 times a mask-b8
workload (1.7 s of its 13 s, round31b's profile); one pass over the bytes takes about a millisecond.
"""

from __future__ import annotations

import functools

import torch

MODULUS = 65521  # the largest prime below 2^16
_CPU_SLICE = 1 << 24  # bytes a slice on the CPU: int64 temporaries of 128 MB
BLOCK = 4096


def _check_key(k1: int, k2: int, nbytes: int) -> None:
    if not (0 < k1 < 2**31 and 0 <= k2 < 2**31):
        raise ValueError(f"checksum key ({k1}, {k2}): expected 0 < k1 < 2^31 and 0 <= k2 < 2^31")
    if nbytes >= 2**39:
        raise ValueError(f"checksum of {nbytes} bytes: at most 2^39 - 1 (the int64 sum would not be exact)")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def keyed_checksum(tensors: list[torch.Tensor], k1: int, k2: int) -> torch.Tensor:
    """The checksum as an int64 scalar tensor on the tensors' device (not read: the caller reads it
    with whatever else it needs, one wait for the device)."""
    raws = [_bytes(t) for t in tensors]
    _check_key(k1, k2, sum(r.numel() for r in raws))
    device = raws[0].device if raws else torch.device("cpu")
    total = torch.zeros((), dtype=torch.int64, device=device)
    offset = 0
    for raw in raws:
        if raw.numel():
            total += (_cuda_sum if raw.is_cuda else torch_sum)(raw, offset, k1, k2)
        offset += raw.numel()
    return total


def torch_sum(raw: torch.Tensor, offset: int, k1: int, k2: int) -> torch.Tensor:
    """The sum over uint8 `raw` whose first byte is at position `offset`, in torch int64 (slices).
    A byte's weight depends on its position modulo MODULUS only, so the weights are read from the key's
    table of them (`_weights`) instead of computed per byte (an arange and two int64 remainders per byte:
    ~18% of a small gallery folder's check on the CPU under cProfile), and the bytes of whole periods are
    summed per residue before the product: the same integer, 10-16x faster at 4 KB-2 MB."""
    total = torch.zeros((), dtype=torch.int64, device=raw.device)
    table = _weights(k1, k2, raw.device)
    for start in range(0, raw.numel(), _CPU_SLICE):
        part = raw[start : start + _CPU_SLICE]
        first = (offset + start) % MODULUS
        weights = table[first : first + MODULUS]  # the weights of MODULUS positions from the slice's first
        whole = part.numel() // MODULUS * MODULUS
        if whole:  # whole periods: bytes of equal residue summed first (each sum < 2^8 * 2^24: exact)
            total += (part[:whole].view(-1, MODULUS).sum(dim=0, dtype=torch.int64) * weights).sum()
        rest = part[whole:]  # starts at a position of the same residue as the slice's first
        total += (rest.to(torch.int64) * weights[: rest.numel()]).sum()
    return total


@functools.lru_cache(maxsize=8)
def _weights(k1: int, k2: int, device: torch.device) -> torch.Tensor:
    """int64 [2 * MODULUS]: entry j is ((j mod MODULUS) * k1 + k2) mod MODULUS + 1, the weight of every byte
    at a position congruent to j; twice over, so that any MODULUS consecutive positions are one slice of it.
    One per key (a conformance run draws one per workload), kept in the parent as the key is."""
    j = torch.arange(MODULUS, dtype=torch.int64, device=device)
    w = torch.remainder(j * k1 + k2, MODULUS) + 1
    return torch.cat([w, w])


def _cuda_sum(raw: torch.Tensor, offset: int, k1: int, k2: int) -> torch.Tensor:
    from grpo_conform.checksum_kernel import block_sums  # Triton only where a GPU (or the interpreter) runs it

    return block_sums(raw, offset, k1, k2, BLOCK, MODULUS).sum()
