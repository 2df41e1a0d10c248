"""Launch shapes of the staged (Gluon, CUDA) kernels (staged.py, launched by staged_members.py):
the H200 settings and where staging can run.

The settings were found by the explorations recorded, with every version tried, in
docs/triton-kernel-notes.md (rounds 4-6). The first kernel generation's launchers (seed member
only) lived here until issue 30; git keeps them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class KernelSettings:
    """How the staged kernels are launched: chunks of `stage_bytes` of shared memory per program,
    swept in blocks of `block` elements (the member kernel), `forward_*` for the statistics kernel."""

    stage_bytes: int
    block: int
    num_warps: int
    thread_stats: bool = True  # per-thread running (max, sum), one CTA reduction per chunk
    forward_stage_bytes: int = 32768
    forward_block: int = 2048
    forward_stage_warps: int = 4


# The H200 choice (docs/triton-kernel-notes.md, rounds 4-6): both passes stage chunks in shared
# memory: the gradient pass in 20 KB chunks (13 programs of 4 warps per row, 11 per SM), the
# statistics pass in 32 KB chunks. Rows that do not start on 16-byte boundaries (a vocabulary that is
# not a multiple of 16 elements, e.g. 50257) are staged from their first boundary on (staged_rows.py);
# where neither can run (row_layout), plan.py keeps the plain kernels of members.py.
GPU_DEFAULT = KernelSettings(stage_bytes=20480, block=2048, num_warps=4, thread_stats=True,
                             forward_stage_bytes=32768, forward_block=2048, forward_stage_warps=4)
LOG2E = 1.4426950408889634


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class Problem:
    """Shapes and scalars of one call, derived once from the inputs."""

    batch: int
    seq: int
    vocab: int
    stride_b: int
    stride_t: int
    inv_temp: float
    eps_low: float
    eps_high: float

    @classmethod
    def of(cls, logits: torch.Tensor, epsilon_low: float, epsilon_high: float, temperature: float) -> "Problem":
        batch, seq_next, vocab = logits.shape
        return cls(batch, seq_next - 1, vocab, logits.stride(0), logits.stride(1), 1.0 / temperature,
                   float(epsilon_low), float(epsilon_high))


def staged_ok(logits: torch.Tensor, p: Problem) -> bool:
    """cp.async moves 16-byte pieces: the row starts and the vocabulary must be 16-byte multiples
    (the JIT then proves the alignment from the arguments), on an sm_80+ GPU, not interpreted."""
    if not logits.is_cuda or interpreting() or torch.cuda.get_device_capability(logits.device)[0] < 8:
        return False
    return (logits.data_ptr() % 16 == 0 and p.vocab % 16 == 0 and p.stride_b % 16 == 0
            and p.stride_t % 16 == 0)


def staged_rows(logits: torch.Tensor, p: Problem) -> str | None:
    """Which staged kernels can run: "aligned" (staged_ok: every record so far), "head" (rows off 16-byte
    boundaries, staged_rows.py), or None (the plain kernels of members.py)."""
    if not logits.is_cuda or interpreting() or torch.cuda.get_device_capability(logits.device)[0] < 8:
        return None
    return row_layout(logits.data_ptr(), logits.element_size(), p.vocab, logits.shape[1], p.stride_b, p.stride_t)


def row_layout(data_ptr: int, element_size: int, vocab: int, seq_next: int, stride_b: int, stride_t: int) -> str | None:
    """The host half of staged_rows, on plain integers (tests run it without a GPU).

    "aligned" is exactly staged_ok's test, so aligned shapes keep the kernels they ran before the head path
    existed. "head" needs: a 16-byte aligned base (the kernels count a row's head from it); every row's
    logits offset equal to its gradient's (row * vocab: the fresh gradient is contiguous) modulo the
    16-byte vector, so one head length serves both tensors, i.e. stride_t = vocab and stride_b =
    seq_next * vocab modulo VEC; and vocab >= 16, so a row is longer than its head (staged_rows.py)."""
    if data_ptr % 16 or 16 % element_size:
        return None
    if vocab % 16 == 0 and stride_b % 16 == 0 and stride_t % 16 == 0:
        return "aligned"
    vec = 16 // element_size
    if vocab >= 16 and (stride_t - vocab) % vec == 0 and (stride_b - seq_next * vocab) % vec == 0:
        return "head"
    return None


def _staged_shape(logits, p: Problem, stage_bytes: int, block: int, num_warps: int) -> dict:
    """Chunk and block sizes of a staged launch: a block is at least one 16-byte piece per thread."""
    vec = 16 // logits.element_size()
    tile = 32 * num_warps * vec  # one 16-byte piece per thread
    block = tile * triton.next_power_of_2(max(1, block // tile) + 1) // 2  # a power-of-two number of tiles
    chunk = max(block, stage_bytes // logits.element_size() // block * block)  # whole blocks
    chunk = min(chunk, triton.cdiv(p.vocab, block) * block)  # no block that is padding only
    n = triton.cdiv(p.vocab, chunk)
    return dict(CHUNK=chunk, BLOCK=block, NUM_CHUNKS=n, CHUNKS_P2=triton.next_power_of_2(n), VEC=vec)
