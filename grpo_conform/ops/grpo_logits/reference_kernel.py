"""The float64 log-probs of `reference.reference_logprobs` on CUDA in one Triton pass over the logits.

Why: torch's chunked float64 log-softmax (a float64 copy of each chunk, the division by T, logsumexp's
exp and sum, the gather) took ~17 ms of GPU time per [8, 1025, 128256] input set on the H200, more than
half of a full generation (the old log-probs are placed from it) and the judging's reference pass of every
new set (thirteenth session). This kernel reads each row once in its own dtype and keeps everything in
float64: the row's maximum of z / T and the sum of exp(z / T - max) block by block (the sum rescaled
when the maximum grows), then logp = z_t / T - (max + log(sum)). The same formula as torch's
logsumexp; the additions differ in order, so a value may differ from torch's in its last bits
(tests/test_reference_kernel.py bounds it at 1e-13 relative).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048
_TEMPERATURES: dict = {}  # (T, device) -> a float64 [1] tensor there: made once (a copy from the host waits)


@triton.jit
def _row_logp_kernel(z_ptr, target_ptr, t_ptr, out_ptr, vocab, DIVIDE_T: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(t_ptr)  # float64: the division is torch's, z / T (at T = 1, z itself: the same bits)
    base = z_ptr + row * vocab
    m = tl.full([], float("-inf"), tl.float64)
    s = tl.full([], 0.0, tl.float64)
    for v0 in range(0, vocab, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float64)
        if DIVIDE_T:
            x = x / temperature
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    z_t = tl.load(base + tl.load(target_ptr + row)).to(tl.float64)
    if DIVIDE_T:
        z_t = z_t / temperature
    tl.store(out_ptr + row, z_t - (m + tl.log(s)))


def row_logprobs(flat: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """float64 [rows]: z[r, targets[r]] / T - logsumexp(z[r] / T) of every row of `flat` [rows, vocab]
    (contiguous, any float dtype)."""
    rows, vocab = flat.shape
    out = torch.empty(rows, dtype=torch.float64, device=flat.device)
    if rows == 0:
        return out
    t = _temperature(float(temperature), flat.device)
    _row_logp_kernel[(rows,)](flat, targets.to(torch.int64), t, out, vocab, DIVIDE_T=float(temperature) != 1.0,
                              BLOCK=max(16, min(BLOCK, triton.next_power_of_2(vocab))))
    return out


def _temperature(value: float, device) -> torch.Tensor:
    key = (value, str(device))
    if key not in _TEMPERATURES:
        _TEMPERATURES[key] = torch.full((1,), value, dtype=torch.float64).to(device)
    return _TEMPERATURES[key]
