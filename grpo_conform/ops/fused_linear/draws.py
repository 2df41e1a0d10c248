"""Seeded normal samples for the large tensors of grpo-fused-linear, drawn where the tensors live.

Why: the weight [V, H] is 525M samples at the seed shapes. Drawn with one seeded CPU generator
(mt19937 is serial: one thread, ~5-10 ns a sample) it cost 2-5 s of host time per input set, 37 input
sets a check run (docs/fused-kernel.md, "Check time"), and then crossed PCIe.

Scheme: a tensor is cut into blocks of rows along its first dimension (`block_rows`: BLOCK elements, at
least one row; fixed by the shape alone). Block j of stream s draws N(0, 1) float32 samples from its
own generator, seeded with `block_seed(seed, s, j)` (splitmix64 of the three: neighbouring seeds,
streams and blocks give unrelated generator states), on the device of the tensor it fills:

- a CUDA tensor draws with CUDA generators (Philox) on the GPU: nothing is drawn on the host or
  copied over PCIe, and the scratch is one block (BLOCK float32 elements), not a second [V, H];
- a CPU tensor draws with CPU generators, the blocks spread over torch's intra-op thread count
  (`torch.randn` / `normal_` release the GIL), each thread into a scratch block of its own that stays
  in cache instead of a fresh [V, H] float32 allocation (page faults cost as much as the samples).

The samples are a function of (seed, stream, block, device type) only: the thread count and the
order in which threads finish change nothing (each block has its own generator and destination). CPU
and CUDA give different samples for one seed (different generators), as before for the logits
operation. Each block is what `torch.randn` draws from a freshly seeded generator: independent,
identically distributed standard normals; blocks of different seeds, streams or indices come from
unrelated generator states. Nothing here is predictable without the seed: every timed seed comes from
the OS (`interface.fresh_seed`), conformance seeds from the run's own OS-seeded generator.

`DRAWN` counts the samples drawn by (stream, device type) since `reset_counts`; tests read it
(tests/test_fused_draws.py): counts, not wall time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import torch

BLOCK = 1 << 22  # elements a block (16 MB of float32 scratch); fixed: the samples must not depend on it at run time
_MASK64 = (1 << 64) - 1

#: streams of the fused operation's large draws (one generator per (seed, stream, block)); a stream is
#: a tuple of ints: (HIDDEN, k) holds the rows of profile k, (CHI2, k, j) their j-th chi-square term
WEIGHT, HIDDEN, BIAS, REF_WEIGHT, REF_HIDDEN, REF_BIAS, CHI2 = (1,), 2, (3,), (4,), (5,), (6,), 7

DRAWN: dict[tuple[tuple[int, ...], str], int] = {}


def reset_counts() -> None:
    DRAWN.clear()


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def block_seed(seed: int, stream: tuple[int, ...], block: int) -> int:
    """A generator seed for one block, all 64 bits mixed (torch's CPU generator keeps the low 32)."""
    x = _splitmix64(seed & _MASK64)
    for part in (*stream, block):
        x = _splitmix64(x ^ _splitmix64(part & _MASK64))
    return x & (2**63 - 1)


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` (CUDA: Philox on the GPU; CPU: mt19937), seeded."""
    return torch.Generator(device=device).manual_seed(seed)


def block_rows(shape: tuple[int, ...]) -> int:
    row = 1
    for d in shape[1:]:
        row *= d
    return max(1, BLOCK // max(1, row))


def fill(out: torch.Tensor, seed: int, stream: tuple[int, ...],
         make: Optional[Callable[[torch.Tensor, slice], torch.Tensor]] = None) -> None:
    """out[rows] = make(z, rows) for every row block, z ~ N(0, 1) float32 [rows, *out.shape[1:]] drawn on
    out's device; without `make`, out (float32) takes the samples themselves. `make` must only read
    its block's rows (blocks may run on several CPU threads at once)."""
    shape = tuple(out.shape) if out.dim() else (1,)
    target = out if out.dim() else out.view(1)
    step = block_rows(shape)
    blocks = [slice(start, min(start + step, shape[0])) for start in range(0, shape[0], step)]
    device = out.device
    key = (stream, device.type)
    DRAWN[key] = DRAWN.get(key, 0) + out.numel()
    scratch: dict[int, torch.Tensor] = {}

    def one(j: int) -> None:
        rows = blocks[j]
        g = generator(device, block_seed(seed, stream, j))
        if make is None and target.dtype == torch.float32 and target[rows].is_contiguous():
            target[rows].normal_(generator=g)
            return
        n = rows.stop - rows.start
        mine = scratch.get(threading.get_ident())
        if mine is None or mine.shape[0] < n:
            mine = scratch[threading.get_ident()] = torch.empty((min(step, shape[0]),) + shape[1:], dtype=torch.float32,
                                                             device=device)
        z = mine[:n].normal_(generator=g)
        target[rows].copy_(z if make is None else make(z, rows))

    workers = min(len(blocks), torch.get_num_threads()) if device.type == "cpu" else 1
    if workers <= 1:
        for j in range(len(blocks)):
            one(j)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(len(blocks))))  # list(): re-raises a block's exception


def normal(shape: tuple[int, ...], seed: int, stream: tuple[int, ...], device) -> torch.Tensor:
    """A float32 tensor of N(0, 1) samples on `device` (`fill`'s blocks)."""
    out = torch.empty(shape, dtype=torch.float32, device=device)
    fill(out, seed, stream)
    return out
