"""The float64 log-probs of `reference.reference_logprobs` on CUDA in one Triton pass over the logits.

Why: torch's chunked float64 log-softmax (a float64 copy of each chunk, the division by T, logsumexp's
exp and sum, the gather) took ~17 ms of GPU time per [8, 1025, 128256] input set on the H200, more than
half of a full generation (the old log-probs are placed from it) and the judging's reference pass of every
new set (thirteenth session). This kernel reads each row once in its own dtype and keeps everything in
float64: the row's maximum of z / T and the sum of exp(z / T - max) block by block (the sum rescaled
when the maximum grows), then logp = z_t / T - (max + log(sum)). The same formula as torch's
logsumexp; the additions differ in order, so a value may differ from torch's in its last bits
(tests/test_reference_kernel.py bounds it at 1e-13 relative).

The same pass also serves the judging's fp32 floors (`row_floor_terms`, fourteenth session): max |z| of the
row and the target's float64 log-prob, which `compare.fp32_target_floor` made with ~8 torch passes of a
float64 copy of the chunk and a separate abs/amax pass (docs/checks.md, "The judge's row floors").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048
SMALL_VOCAB = 64  # vocabularies up to this take a block of its width, all others BLOCK (logits_kernel.py says why)
_TEMPERATURES: dict = {}  # (T, device) -> a float64 [1] tensor there: made once (a copy from the host waits)


@triton.jit
def _row_logp_kernel(z_ptr, target_ptr, t_ptr, out_ptr, amax_ptr, vocab, DIVIDE_T: tl.constexpr,
                     ABSMAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(t_ptr)  # float64: the division is torch's, z / T (at T = 1, z itself: the same bits)
    base = z_ptr + row * vocab
    m = tl.full([], float("-inf"), tl.float64)
    s = tl.full([], 0.0, tl.float64)
    a = tl.full([], 0.0, tl.float64)  # ABSMAX: max |z| of the row (a max: exact), NaN if the row holds one
    nan = tl.full([], 0, tl.int32)
    for v0 in range(0, vocab, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        inside = offs < vocab
        x = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float64)
        if ABSMAX:
            a = tl.maximum(a, tl.max(tl.where(inside, tl.abs(x), 0.0), axis=0))
            nan += tl.sum(((x != x) & inside).to(tl.int32), axis=0)
        if DIVIDE_T:
            x = x / temperature
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    z_t = tl.load(base + tl.load(target_ptr + row)).to(tl.float64)
    if DIVIDE_T:
        z_t = z_t / temperature
    tl.store(out_ptr + row, z_t - (m + tl.log(s)))
    if ABSMAX:
        tl.store(amax_ptr + row, tl.where(nan > 0, float("nan"), a))


def row_logprobs(flat: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """float64 [rows]: z[r, targets[r]] / T - logsumexp(z[r] / T) of every row of `flat` [rows, vocab]
    (contiguous, any float dtype)."""
    return _launch(flat, targets, temperature, absmax=False)[0]


def row_floor_terms(flat: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(max |z| of each row, as torch's z.abs().amax(-1): the same value, NaN where the row holds one;
    the row's float64 log-prob of its target, as `row_logprobs`), both float64 [rows], from one read of
    the rows: what the judging's fp32 floors are made of (judge.row_floor_parts)."""
    logp, amax = _launch(flat, targets, temperature, absmax=True)
    return amax, logp


def _launch(flat: torch.Tensor, targets: torch.Tensor, temperature: float, absmax: bool):
    """(log-probs, max |z| per row) from one launch of the kernel; without `absmax` the second is the first
    (the kernel never writes it then)."""
    rows, vocab = flat.shape
    out = torch.empty(rows, dtype=torch.float64, device=flat.device)
    amax = torch.empty(rows, dtype=torch.float64, device=flat.device) if absmax else out
    if rows == 0:
        return out, amax
    t = _temperature(float(temperature), flat.device)
    _row_logp_kernel[(rows,)](flat, targets.to(torch.int64), t, out, amax, vocab, DIVIDE_T=float(temperature) != 1.0,
                              ABSMAX=absmax, BLOCK=SMALL_VOCAB if vocab <= SMALL_VOCAB else BLOCK)
    return out, amax


def _temperature(value: float, device) -> torch.Tensor:
    key = (value, str(device))
    if key not in _TEMPERATURES:
        _TEMPERATURES[key] = torch.full((1,), value, dtype=torch.float64).to(device)
    return _TEMPERATURES[key]
