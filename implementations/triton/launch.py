"""Launchers: frozen settings in, output tensors out. No autograd here.

The settings that reach the floor on the H200 were found by benchmarks/explore_triton.py and are
recorded, with every version tried, in docs/triton-kernel-notes.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton

from . import kernels


@dataclass(frozen=True)
class KernelSettings:
    """How to launch.

    fused: 'sync' (a row split over programs that keep their chunk in registers and wait for each
    other), 'split' (the same split, each program sweeping its chunk twice in blocks),
    'two_sweep' (one program per row, or a persistent grid, sweeping the row twice) or 'staged'
    (the split with each chunk staged in shared memory: staged.py, CUDA only; where its
    conditions do not hold, `staged_fallback` is used).
    """

    fused: Literal["sync", "split", "two_sweep", "staged"] = "split"
    chunk: int = 16384  # elements per program (sync, split)
    block: int = 4096  # elements per loop step (split, two_sweep)
    num_warps: int = 8
    num_stages: int = 1  # software pipelining of the block loops
    persistent: bool = False  # two_sweep: a fixed grid of programs_per_sm x SMs
    programs_per_sm: int = 1
    hints: bool = True  # keep the first sweep in L2, stream the gradient out
    stream_stores: bool = True  # sync: gradient stores marked streaming (.cs)
    vector: bool = True  # per-lane running (max, sum): no barrier per block (kernels._chunk_stats)
    stage_bytes: int = 65536  # staged: shared memory per program (one chunk of the row)
    thread_stats: bool = True  # staged: per-thread running (max, sum), one CTA reduction per chunk
    forward_chunk: int = 8192  # forward: elements per program; 0 = chosen from the number of tokens
    forward_block: int = 8192  # forward: elements per loop step
    forward_warps: int = 4
    forward_stages: int = 1
    forward_vector: bool = True
    forward_programs: int = 16384  # forward_chunk == 0: split rows until about this many programs
    forward_stage_bytes: int = 0  # > 0: the loss-only pass stages chunks of this size (staged.py)
    forward_stage_warps: int = 4


# The H200 choice (docs/triton-kernel-notes.md, rounds 4-6): both passes stage chunks in shared
# memory (staged.py): the gradient pass in 20 KB chunks (13 programs of 4 warps per row, 11 per
# SM), the loss-only pass in 32 KB chunks. Where staging cannot run (vocabulary or row starts not
# 16-byte multiples), the plain split kernel (round 2's best) and one-warp loss programs.
GPU_DEFAULT = KernelSettings(fused="staged", stage_bytes=20480, block=2048, num_warps=4, thread_stats=True,
                             chunk=16384, vector=False, forward_chunk=0, forward_block=2048, forward_warps=1,
                             forward_stages=1, forward_vector=False, forward_stage_bytes=32768)
STAGED_FALLBACK = replace(GPU_DEFAULT, fused="split")
LOG2E = 1.4426950408889634


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def settings_for(vocab: int, device: torch.device) -> KernelSettings:
    """The interpreter runs programs one after another: a row must then be one chunk (nothing to wait for)."""
    if device.type != "cuda" or interpreting():
        whole = triton.next_power_of_2(vocab)
        return KernelSettings(fused="split", chunk=whole, block=min(whole, 4096), num_warps=4,
                              forward_chunk=whole, forward_block=min(whole, 4096), forward_warps=4)
    return GPU_DEFAULT


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

    @property
    def inv_bst(self) -> float:
        return self.inv_temp / (self.batch * max(1, self.seq))

    @classmethod
    def of(cls, logits: torch.Tensor, epsilon_low: float, epsilon_high: float, temperature: float) -> "Problem":
        batch, seq_next, vocab = logits.shape
        return cls(batch, seq_next - 1, vocab, logits.stride(0), logits.stride(1), 1.0 / temperature,
                   float(epsilon_low), float(epsilon_high))


def _chunks(vocab: int, chunk: int) -> tuple[int, int]:
    n = triton.cdiv(vocab, chunk)
    return n, triton.next_power_of_2(n)


def _finalize(token_loss: torch.Tensor, p: Problem) -> torch.Tensor:
    loss = torch.empty((), dtype=torch.float32, device=token_loss.device)
    kernels._finalize_kernel[(1,)](token_loss, loss, p.batch, p.seq, BLOCK=1024, num_warps=4)
    return loss


def forward_loss(logits, ids, adv, p: Problem, s: KernelSettings) -> torch.Tensor:
    """The loss only (torch.no_grad): one read of the logits, no gradient work."""
    dev = logits.device
    tokens = p.batch * p.seq
    if s.forward_stage_bytes and tokens and staged_ok(logits, p):
        return _finalize(_staged_forward(logits, ids, adv, p, s), p)
    chunk = s.forward_chunk
    if chunk == 0:  # enough programs to fill the GPU, whole rows when the batch already does
        splits = max(1, min(64, s.forward_programs // max(1, tokens)))
        chunk = triton.cdiv(triton.cdiv(p.vocab, splits), s.forward_block) * s.forward_block
    n, n_p2 = _chunks(p.vocab, chunk)
    part_m, part_s, count = _partials(tokens, n, dev)
    token_loss = torch.empty(tokens, dtype=torch.float32, device=dev)
    if tokens:
        kernels._forward_kernel[(tokens * n,)](
            logits, ids, adv, part_m, part_s, count, token_loss,
            p.stride_b, p.stride_t, p.seq, p.vocab, p.inv_temp, p.eps_low, p.eps_high,
            CHUNK=chunk, BLOCK=min(s.forward_block, chunk), NUM_CHUNKS=n, CHUNKS_P2=n_p2,
            NUM_STAGES=s.forward_stages, VECTOR=s.forward_vector, num_warps=s.forward_warps,
        )
    return _finalize(token_loss, p)


def fused_loss_and_grad(logits, ids, adv, p: Problem, s: KernelSettings):
    """Loss, gradient (logits dtype, last position exactly 0) and per-token row statistics, in one pass.

    The statistics are [2, tokens] float32: each row's max logit and ln S (S = sum exp((x - max) / T)),
    kept apart so rows of huge logits keep their precision (kernels.py says why); `lse_of` folds them."""
    dev = logits.device
    tokens = p.batch * p.seq
    rows = p.batch * (p.seq + 1)
    grad = torch.empty((p.batch, p.seq + 1, p.vocab), dtype=logits.dtype, device=dev)
    token_loss = torch.empty(tokens, dtype=torch.float32, device=dev)
    stats = torch.empty((2, tokens), dtype=torch.float32, device=dev)
    row_m, row_logs = stats[0], stats[1]
    if s.fused == "two_sweep":
        if s.persistent:
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            grid = (min(rows, sms * s.programs_per_sm),)
        else:
            grid = (rows,)
        kernels._two_sweep_kernel[grid](
            logits, ids, adv, grad, token_loss, row_m, row_logs,
            p.stride_b, p.stride_t, p.seq, p.vocab, rows, p.inv_temp, p.eps_low, p.eps_high, p.inv_bst,
            BLOCK=s.block, PERSISTENT=s.persistent, HINTS=s.hints, NUM_STAGES=s.num_stages, VECTOR=s.vector,
            num_warps=s.num_warps,
        )
    elif s.fused == "staged" and staged_ok(logits, p):
        _launch_staged(logits, ids, adv, grad, token_loss, row_m, row_logs, p, s)
    else:
        if s.fused == "staged":
            s = STAGED_FALLBACK
        n, n_p2 = _chunks(p.vocab, s.chunk)
        part_m, part_s, count = _partials(tokens, n, dev)
        common = (p.stride_b, p.stride_t, p.seq, p.vocab, p.inv_temp, p.eps_low, p.eps_high, p.inv_bst)
        if s.fused == "sync":
            kernels._fused_kernel[(rows * n,)](
                logits, ids, adv, grad, part_m, part_s, count, token_loss, row_m, row_logs, *common,
                CHUNK=s.chunk, NUM_CHUNKS=n, CHUNKS_P2=n_p2, SYNC=n > 1, STREAM_STORES=s.stream_stores,
                num_warps=s.num_warps,
            )
        else:
            kernels._split_kernel[(rows * n,)](
                logits, ids, adv, grad, part_m, part_s, count, token_loss, row_m, row_logs, *common,
                CHUNK=s.chunk, BLOCK=min(s.block, s.chunk), NUM_CHUNKS=n, CHUNKS_P2=n_p2, NUM_STAGES=s.num_stages,
                HINTS=s.hints, VECTOR=s.vector, num_warps=s.num_warps,
            )
    return _finalize(token_loss, p), grad, stats


def lse_of(stats: torch.Tensor, p: Problem) -> torch.Tensor:
    """Per-token log-sum-exp of z / T from the row statistics (for tests and readers)."""
    return stats[0] * p.inv_temp + stats[1]


def staged_ok(logits: torch.Tensor, p: Problem) -> bool:
    """cp.async moves 16-byte pieces: the row starts and the vocabulary must be 16-byte multiples
    (the JIT then proves the alignment from the arguments), on an sm_80+ GPU, not interpreted."""
    if not logits.is_cuda or interpreting() or torch.cuda.get_device_capability(logits.device)[0] < 8:
        return False
    return (logits.data_ptr() % 16 == 0 and p.vocab % 16 == 0 and p.stride_b % 16 == 0
            and p.stride_t % 16 == 0)


def _staged_shape(logits, p: Problem, stage_bytes: int, block: int, num_warps: int) -> dict:
    """Chunk and block sizes of a staged launch: a block is at least one 16-byte piece per thread."""
    vec = 16 // logits.element_size()
    tile = 32 * num_warps * vec  # one 16-byte piece per thread
    block = tile * triton.next_power_of_2(max(1, block // tile) + 1) // 2  # a power-of-two number of tiles
    chunk = max(block, stage_bytes // logits.element_size() // block * block)  # whole blocks
    chunk = min(chunk, triton.cdiv(p.vocab, block) * block)  # no block that is padding only
    n, n_p2 = _chunks(p.vocab, chunk)
    return dict(CHUNK=chunk, BLOCK=block, NUM_CHUNKS=n, CHUNKS_P2=n_p2, VEC=vec)


def _partials(tokens: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-chunk (max, sum) slots and the per-token arrival counters (zeroed: one memset)."""
    part_m = torch.empty(tokens * n, dtype=torch.float32, device=device)
    part_s = torch.empty(tokens * n, dtype=torch.float32, device=device)
    count = torch.zeros(max(tokens, 1) if n > 1 else 1, dtype=torch.int32, device=device)
    return part_m, part_s, count


def _launch_staged(logits, ids, adv, grad, token_loss, row_m, row_logs, p: Problem, s: KernelSettings) -> None:
    from . import staged  # Gluon: imported only where it can run

    shape = _staged_shape(logits, p, s.stage_bytes, s.block, s.num_warps)
    part_m, part_s, count = _partials(p.batch * p.seq, shape["NUM_CHUNKS"], logits.device)
    staged._staged_kernel[(p.batch * (p.seq + 1) * shape["NUM_CHUNKS"],)](
        logits, ids, adv, grad, part_m, part_s, count, token_loss, row_m, row_logs,
        p.stride_b, p.stride_t, p.seq, p.vocab, p.inv_temp * LOG2E, p.inv_temp, p.eps_low, p.eps_high, p.inv_bst,
        **shape, THREAD_STATS=s.thread_stats, num_warps=s.num_warps,
    )


def _staged_forward(logits, ids, adv, p: Problem, s: KernelSettings) -> torch.Tensor:
    from . import staged

    shape = _staged_shape(logits, p, s.forward_stage_bytes, s.forward_block, s.forward_stage_warps)
    tokens = p.batch * p.seq
    part_m, part_s, count = _partials(tokens, shape["NUM_CHUNKS"], logits.device)
    token_loss = torch.empty(tokens, dtype=torch.float32, device=logits.device)
    staged._staged_forward_kernel[(tokens * shape["NUM_CHUNKS"],)](
        logits, ids, adv, part_m, part_s, count, token_loss,
        p.stride_b, p.stride_t, p.seq, p.vocab, p.inv_temp * LOG2E, p.inv_temp, p.eps_low, p.eps_high,
        **shape, THREAD_STATS=s.thread_stats, num_warps=s.forward_stage_warps,
    )
    return token_loss


def scale_in_place(grad: torch.Tensor, dloss: torch.Tensor) -> None:
    """grad *= dloss without a host sync; a no-op on the device when dloss == 1."""
    n = grad.numel()
    block = 4096
    if grad.is_cuda and not interpreting():
        programs = min(triton.cdiv(n, block), 4 * torch.cuda.get_device_properties(grad.device).multi_processor_count)
    else:
        programs = min(triton.cdiv(n, block), 4)
    kernels._scale_kernel[(max(1, programs),)](grad, dloss.reshape(1), n, BLOCK=block, num_warps=4)


def grad_from_stats(logits, ids, adv, stats, dloss, p: Problem, s: KernelSettings) -> torch.Tensor:
    grad = torch.empty((p.batch, p.seq + 1, p.vocab), dtype=logits.dtype, device=logits.device)
    n, _ = _chunks(p.vocab, s.forward_block)
    kernels._grad_from_stats_kernel[(p.batch * (p.seq + 1), n)](
        logits, ids, adv, stats[0], stats[1], grad, dloss.reshape(1),
        p.stride_b, p.stride_t, p.seq, p.vocab, p.inv_temp, p.eps_low, p.eps_high, p.inv_bst,
        CHUNK=s.forward_block, num_warps=s.forward_warps,
    )
    return grad
