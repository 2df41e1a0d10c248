"""The logits' draw on CUDA in one Triton pass (`inputs.fill_logits`): every row written once, from its
profile's parameters, with Philox normals (`tl.randn4x`: four a counter) keyed by the draw's seed and
the row.

Why: the torch draw (randn per chunk and profile, Student-t's extra normals, the scale, the clamps, the
spike and a row scatter into the logits) took ~21 ms of GPU time per [8, 1025, 128256] set on the H200,
about half of a full generation (41 ms, thirteenth session), and a batch-8 masked workload draws ~40
sets (conformance and timing). One pass writes the 2 GB once: ~0.5 ms at the copy ceiling.

The same distributions as the torch draw (`inputs._sample`), row by row: N(0, 1) x scale, clamped to
+-clamp where the profile has one; `peaked` adds its spike at the row's target column; Student-t divides a
normal by sqrt(chi2_df / df) (at least 1e-6) with chi2_df the sum of df squared normals; every value then
clamped to the dtype's max / 4. Not the same values: the CPU keeps torch's draw (its tests and gallery
expectations), and a seed gives the same logits on every CUDA run (Philox is counter-based).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Profile kinds as the kernel's table codes them.
KINDS = {"normal": 0, "peaked": 1, "student_t": 2}
BLOCK = 4096
#: vocabularies up to SMALL_VOCAB take a block of that width, all others BLOCK: with the vocabulary's divisibility by 16
#: (Triton's own specialisation, kept: aligned rows store 16 bytes at a time) at most four kernels a dtype. A block
#: of the vocabulary's next power of two compiled a kernel for nearly every shape reach draws: most of the ~8 s a
#: slot spent drawing a member's first reach calls on an H100 (forty-third session, `s43c`; docs/timing.md)
SMALL_VOCAB = 64
_TABLES: dict = {}  # (the profiles' parameters, device) -> their table there
ROW_KEY = tl.constexpr(0x9E3779B1)  # a row's Philox key: the seed plus the row times this (odd)
SEED_BITS = (1 << 62) - 1
SEED_TOP = 1 << 61  # always set: the seed is an int64 argument at every draw (one compiled kernel)


@triton.jit
def _finish(base, offs, x, chi2, df, scale, clamp, spike, target, limit, vocab):
    """One quarter of a block: the profile's transform of its normals, clamps, spike, store."""
    denom = tl.where(df > 0, tl.maximum(tl.sqrt(chi2 / tl.maximum(df, 1).to(tl.float32)), 1e-6), 1.0)
    x = x / denom * scale
    x = tl.minimum(tl.maximum(x, -clamp), clamp)
    x = tl.where(offs == target, x + spike, x)
    x = tl.minimum(tl.maximum(x, -limit), limit)
    tl.store(base + offs, x.to(base.dtype.element_ty), mask=offs < vocab)


@triton.jit(do_not_specialize=["seed"])
def _fill_rows_kernel(out_ptr, order_ptr, target_ptr, table_ptr, seed, vocab, limit, BLOCK: tl.constexpr):
    """One program a row; each Philox call gives four normals (`tl.randn4x`), for four quarters of a block."""
    Q: tl.constexpr = BLOCK // 4
    row = tl.program_id(0).to(tl.int64)
    k = tl.load(order_ptr + row).to(tl.int64)  # the row's profile
    scale = tl.load(table_ptr + k * 4 + 0)
    clamp = tl.load(table_ptr + k * 4 + 1)  # +inf without a clamp
    df = tl.load(table_ptr + k * 4 + 2).to(tl.int32)  # 0 unless Student-t
    spike = tl.load(table_ptr + k * 4 + 3)  # 0 unless peaked
    target = tl.load(target_ptr + row)  # -1: no spike
    key = seed + row * ROW_KEY
    base = out_ptr + row * vocab
    stride = vocab // 4 + Q  # counters of one draw of the row: past every block's
    for v0 in range(0, vocab, BLOCK):
        c = v0 // 4 + tl.arange(0, Q)
        x0, x1, x2, x3 = tl.randn4x(key, c)
        q0 = tl.zeros([Q], tl.float32)
        q1 = tl.zeros([Q], tl.float32)
        q2 = tl.zeros([Q], tl.float32)
        q3 = tl.zeros([Q], tl.float32)
        for d in range(0, df):  # Student-t's chi-square: df more normals per element
            z0, z1, z2, z3 = tl.randn4x(key, c + (d + 1) * stride)
            q0 += z0 * z0
            q1 += z1 * z1
            q2 += z2 * z2
            q3 += z3 * z3
        offs = v0 + tl.arange(0, Q)
        _finish(base, offs, x0, q0, df, scale, clamp, spike, target, limit, vocab)
        _finish(base, offs + Q, x1, q1, df, scale, clamp, spike, target, limit, vocab)
        _finish(base, offs + 2 * Q, x2, q2, df, scale, clamp, spike, target, limit, vocab)
        _finish(base, offs + 3 * Q, x3, q3, df, scale, clamp, spike, target, limit, vocab)


def profile_table(profiles, device) -> torch.Tensor:
    """float32 [P, 4]: (scale, clamp or +inf, df (0 unless Student-t), spike (0 unless peaked)) per profile;
    made once per profile list and device (a copy from the host waits for the device's queue)."""
    rows = []
    for p in profiles:
        if p.kind not in KINDS:
            raise ValueError(f"profile {p.name!r}: kind {p.kind!r} has no kernel draw (expected one of {sorted(KINDS)})")
        df = max(1, round(p.df)) if p.kind == "student_t" else 0
        rows.append((p.scale, p.clamp if p.clamp is not None else float("inf"), float(df),
                     p.spike if p.kind == "peaked" else 0.0))
    key = (tuple(rows), str(device))
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(rows, dtype=torch.float32).to(device)
    return _TABLES[key]


def fill_rows(flat: torch.Tensor, order: torch.Tensor, target: torch.Tensor, table: torch.Tensor, seed: int,
              limit: float) -> None:
    """Writes every row of `flat` [rows, vocab] (contiguous) from its profile `order[row]` (an index into
    `table`), with the spike of a peaked profile at `target[row]` (-1: none)."""
    rows, vocab = flat.shape
    if rows == 0 or vocab == 0:
        return
    _fill_rows_kernel[(rows,)](flat, order.to(torch.int32), target.to(torch.int64), table, (seed & SEED_BITS) | SEED_TOP,
                               vocab, float(limit), BLOCK=SMALL_VOCAB if vocab <= SMALL_VOCAB else BLOCK)
