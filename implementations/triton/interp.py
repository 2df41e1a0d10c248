"""Row-blocked twins of the member kernels for the CPU interpreter (TRITON_INTERPRET=1); never on CUDA.

Why: the interpreter runs a launch's programs one after another, each as Python executing every `tl`
operation on numpy arrays. Its cost is per program and per operation, almost independent of the
tensor sizes at CPU shapes: the plain kernels (members.py) run one program per logits row, ~12 ms of
CPU per row for a forward and backward (a [4, 12, 1536] call: 0.5-0.7 s). Here one program handles
a tile of ROWS rows x BLOCK vocabulary elements as 2-D blocks, so a call costs a few launches and a
few hundred operations whatever the row count (docs/timing.md, CPU section, has the measurements).

What is shared with the plain kernels: the member semantics (`_differences`, `_token_terms` and the
helpers they call, members.py), called here on blocks of tokens as `_terms_kernel` already does;
the per-call buffer `ws`, the plan's `flag`, the gradient modes, and the one-kernel-per-step order
of plan.py. What differs: the loop structure only. Each kernel below is the single-chunk case of its
plain twin (the interpreter's only case: its programs cannot wait for each other), row by row:
- `_rows_main_kernel` = `_main_kernel` with NUM_CHUNKS = 1 (IN_BACKWARD included);
- `_rows_stats_kernel` = `_stats_kernel` with NUM_CHUNKS = 1;
- `_rows_grad_kernel` = `_grad_kernel` with one work item per row.
The running (max, sum of exp) over the row's blocks is `_block_update` of kernels.py, per row, with
the exponent's base set to 0 where a row has no finite maximum yet (masked rows of the tile; the
plain kernels never run them): the same arithmetic on every row the plain kernels compute.
Masked rows are never read (every load of a row is masked by its liveness), the rows a plain kernel
writes zeros to get exact zeros, and a token whose row is not live reads its per-token inputs at
token 0 (a valid address) and every value derived from them is discarded with `tl.where`.

`use_interpreter_shim()` (called by plan.py when interpreting): Triton's interpreter re-patches
`triton.language` (`inspect.getmembers` over four modules, ~3 ms) on every call of a nested
`@triton.jit` function, although the launch that runs it patched the same modules already and
keeps them patched until it returns. The helpers of this package (kernels.py, members.py) see the
same `triton.language` module as their callers, so the second patch changes nothing: the shim
skips it for these helpers only, and only while a launch holds the patch. With another Triton whose
interpreter lacks the attributes it relies on, it does nothing (the calls are then slower, not
different).
"""

from __future__ import annotations

import inspect
import types

import torch
import triton
import triton.language as tl

from . import fastlaunch
from .members import _differences, _kl_terms, _policy_terms, _token_terms
from .plan import Plan, interpreting

# Tile budget of one operation (elements): numpy's per-call overhead is amortised above ~2^14
# elements, and the interpreter refuses blocks above 2^20.
TILE = 1 << 17
BLOCK_MAX = 1 << 16


def shape(rows: int, vocab: int) -> dict:
    """ROWS x BLOCK of a row-blocked launch: the whole vocabulary in one block where it fits
    BLOCK_MAX (one step per pass), then as many rows as the tile holds (every row in one program
    at the CPU tier's shapes)."""
    block = min(triton.next_power_of_2(max(1, vocab)), BLOCK_MAX)
    rows_p2 = triton.next_power_of_2(max(1, rows))
    return dict(ROWS=max(1, min(rows_p2, TILE // block)), BLOCK=block)


@triton.jit
def _load_f32(ptrs, mask, other: tl.constexpr, BF16: tl.constexpr):
    """Logits as float32. BF16: `ptrs` address the int16 view of bfloat16 logits (`_Bits`), widened
    exactly by a shift (the interpreter's own bfloat16 conversion runs bit fields through numpy: ~20 ms
    per [64, 2048] tile)."""
    if BF16:
        if other == 0.0:
            bits = tl.load(ptrs, mask=mask, other=0)
        else:  # -inf
            bits = tl.load(ptrs, mask=mask, other=-128)  # 0xff80
        x = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(ptrs, mask=mask, other=other).to(tl.float32)
    return x


@triton.jit
def _store_grad(ptrs, g, mask, BF16: tl.constexpr):
    """The gradient in the logits dtype. BF16: into the int16 view, rounded to nearest even as
    torch's and CUDA's conversions do (NaN: 0x7fc0)."""
    if BF16:
        u = g.to(tl.uint32, bitcast=True)
        hi = u >> 16
        lo = u & 0xFFFF
        up = ((lo > 0x8000) | ((lo == 0x8000) & ((hi & 1) == 1))).to(tl.uint32)
        r = tl.where(g != g, 0x7FC0, tl.add(hi, up, sanitize_overflow=False))  # hi + up <= 0x10000: no overflow
        tl.store(ptrs, r.to(tl.int16), mask=mask)
    else:
        tl.store(ptrs, g.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _rows_stats_pass(row_ptrs, live, vocab, inv_temp, ROWS: tl.constexpr, BLOCK: tl.constexpr, BF16: tl.constexpr):
    """Per row: (max, ln S, the max made finite) over the whole vocabulary, blocks of BLOCK."""
    m = tl.full([ROWS], -float("inf"), tl.float32)
    s = tl.zeros([ROWS], tl.float32)
    for v0 in range(0, vocab, BLOCK):
        offs = tl.arange(0, BLOCK).to(tl.int64) + v0
        inside = offs < vocab
        x = _load_f32(row_ptrs[:, None] + offs[None, :], live[:, None] & inside[None, :], -float("inf"), BF16)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        base = tl.where(m_new > -float("inf"), m_new, 0.0)  # a row with nothing finite yet: s stays 0
        s = s * tl.exp((m - base) * inv_temp) + tl.sum(tl.exp((x - base[:, None]) * inv_temp), axis=1)
        m = m_new
    m_use = tl.where(live, m, 0.0)
    log_s = tl.log(tl.where(live, s, 1.0))
    return m, log_s, m_use


@triton.jit
def _rows_main_kernel(logits_ptr, ids_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, wb_ptr, rb_ptr,
                      grad_ptr, part_ptr, aux_ptr, ws_ptr, flag_ptr,
                      tokens, stride_b, stride_t, seq, vocab, inv_temp, inv_lo, eps_low, eps_high, delta, beta,
                      cap, w_const, N_ROWS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                      HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RHO: tl.constexpr,
                      HAS_DELTA: tl.constexpr, HAS_CAP: tl.constexpr, CISPO: tl.constexpr, KL_BC: tl.constexpr,
                      RHO_MASK: tl.constexpr, SEQ_RHO: tl.constexpr, SAPO: tl.constexpr, PER_SEQ_W: tl.constexpr,
                      IN_BACKWARD: tl.constexpr, BF16: tl.constexpr, FUSED: tl.constexpr = False,
                      GLOBAL_W: tl.constexpr = False, BATCH: tl.constexpr = 1, SEQ_P2: tl.constexpr = 1,
                      TOK_P2: tl.constexpr = 1, FIN_BLOCK: tl.constexpr = 1024):
    """members._main_kernel, one chunk per row, ROWS rows per program (part_ptr unused; aux_ptr unused
    unless FUSED). FUSED (one program holds every row; `InterpPlan.forward_full`): also the work of the
    launches around it, in their arithmetic: the per-sequence weights of _norm_kernel (PER_SEQ_W; wb_ptr
    unread) and the loss sum of _finalize_kernel into aux_ptr, from the token losses this program stored."""
    pid = tl.program_id(0)
    row = tl.arange(0, ROWS).to(tl.int64) + pid.to(tl.int64) * ROWS  # int64: no overflow checks to interpret
    in_rows = row < N_ROWS
    seq1 = seq.to(tl.int64) + 1
    T = tokens.to(tl.int64)
    b = row // seq1
    t = row % seq1
    token = b * seq + t
    scored = in_rows & (t < seq)
    live = scored
    if HAS_MASK:
        live = live & (tl.load(mask_ptr + token, mask=scored, other=0) != 0)
    tok = tl.where(live, token, 0)
    b_safe = tl.where(in_rows, b, 0)
    if IN_BACKWARD:
        write = True
        c_pred = tl.load(flag_ptr).to(tl.float32)
    else:
        mode = tl.load(flag_ptr)
        c_pred = tl.load(flag_ptr + 1)
        if pid == 0:
            tl.store(ws_ptr + 7 * T, mode)
            tl.store(ws_ptr + 7 * T + 1, c_pred)
        write = mode == 0.0
    row_ptrs = logits_ptr + b_safe.to(tl.int64) * stride_b + t.to(tl.int64) * stride_t
    m, log_s, m_use = _rows_stats_pass(row_ptrs, live, vocab, inv_temp, ROWS, BLOCK, BF16)
    target = tl.load(ids_ptr + tok, mask=live, other=0)
    x_c = _load_f32(row_ptrs + target, live, 0.0, BF16)
    logp, lr, dref = _differences(x_c, m_use, log_s, inv_temp, inv_lo, tok, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
    if PER_SEQ_W:
        if FUSED:  # _norm_kernel's weights (HAS_MASK: members with per-sequence weights have a mask)
            if GLOBAL_W:  # 1 / max(1, N): every unmasked token of the batch
                i_all = tl.arange(0, TOK_P2).to(tl.int64)
                n_all = tl.sum(tl.where(tl.load(mask_ptr + i_all, mask=i_all < T, other=0) != 0, 1.0, 0.0), axis=0)
                w = tl.zeros([ROWS], tl.float32) + 1.0 / tl.maximum(n_all, 1.0)
            else:  # 1 / (B max(1, n_b)): the unmasked tokens of the row's sequence
                t2 = tl.arange(0, SEQ_P2).to(tl.int64)
                in2 = in_rows[:, None] & (t2[None, :] < seq)
                m2 = tl.load(mask_ptr + b_safe[:, None] * seq + t2[None, :], mask=in2, other=0) != 0
                w = 1.0 / (BATCH * tl.maximum(tl.sum(tl.where(m2, 1.0, 0.0), axis=1), 1.0))
        else:
            w = tl.load(wb_ptr + b_safe)
    else:
        w = w_const
    if SEQ_RHO:
        q_ptr = rb_ptr
        q_idx = b_safe
    else:
        q_ptr = rho_ptr
        q_idx = tok
    adv = tl.load(adv_ptr + b_safe).to(tl.float32)
    loss, dlogp = _token_terms(logp, lr, dref, q_idx, adv, w, q_ptr, eps_low, eps_high, delta, beta, cap, HAS_KL,
                               HAS_RHO, HAS_DELTA, HAS_CAP, CISPO, KL_BC, RHO_MASK, SAPO)
    coef = tl.where(live, -dlogp * inv_temp, 0.0)
    if not IN_BACKWARD:
        tl.store(ws_ptr + tok, m, mask=live)
        tl.store(ws_ptr + T + tok, log_s, mask=live)
        tl.store(ws_ptr + 2 * T + tok, logp, mask=live)
        tl.store(ws_ptr + 3 * T + token, coef, mask=scored)
        tl.store(ws_ptr + 4 * T + token, tl.where(live, loss, 0.0), mask=scored)
    if write:
        coef_g = coef * c_pred
        grad_rows = grad_ptr + row * vocab
        for v0 in range(0, vocab, BLOCK):
            offs = tl.arange(0, BLOCK).to(tl.int64) + v0
            inside = offs < vocab
            x = _load_f32(row_ptrs[:, None] + offs[None, :], live[:, None] & inside[None, :], 0.0, BF16)
            p = tl.exp((x - m_use[:, None]) * inv_temp - log_s[:, None])
            g = coef_g[:, None] * (p - tl.where(offs[None, :] == target[:, None], 1.0, 0.0))
            g = tl.where(live[:, None], g, 0.0)
            _store_grad(grad_rows[:, None] + offs[None, :], g, in_rows[:, None] & inside[None, :], BF16)
    if FUSED:  # _finalize_kernel: the same lanes and order, read back from this program's own stores
        total = tl.zeros([FIN_BLOCK], tl.float32)
        for i0 in range(0, tokens, FIN_BLOCK):
            i = tl.arange(0, FIN_BLOCK).to(tl.int64) + i0
            total += tl.load(ws_ptr + 4 * T + i, mask=i < T, other=0.0)
        tl.store(aux_ptr, tl.sum(total, axis=0))


@triton.jit
def _rows_stats_kernel(logits_ptr, ids_ptr, mask_ptr, old_ptr, ref_ptr, part_ptr, count_ptr, ws_ptr, tokens,
                       stride_b, stride_t, seq, vocab, inv_temp, inv_lo,
                       ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_MASK: tl.constexpr, HAS_OLD: tl.constexpr,
                       HAS_KL: tl.constexpr, BF16: tl.constexpr):
    """members._stats_kernel, one chunk per row, ROWS tokens per program (part_ptr, count_ptr unused)."""
    pid = tl.program_id(0)
    token = tl.arange(0, ROWS).to(tl.int64) + pid.to(tl.int64) * ROWS
    T = tokens.to(tl.int64)
    live = token < T
    b = tl.where(live, token // seq, 0)
    t = tl.where(live, token % seq, 0)
    if HAS_MASK:
        live = live & (tl.load(mask_ptr + token, mask=live, other=0) != 0)
    tok = tl.where(live, token, 0)
    row_ptrs = logits_ptr + b.to(tl.int64) * stride_b + t.to(tl.int64) * stride_t
    m, log_s, m_use = _rows_stats_pass(row_ptrs, live, vocab, inv_temp, ROWS, BLOCK, BF16)
    x_c = _load_f32(row_ptrs + tl.load(ids_ptr + tok, mask=live, other=0), live, 0.0, BF16)
    logp, lr, dref = _differences(x_c, m_use, log_s, inv_temp, inv_lo, tok, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
    tl.store(ws_ptr + tok, m, mask=live)
    tl.store(ws_ptr + T + tok, log_s, mask=live)
    tl.store(ws_ptr + 2 * T + tok, logp, mask=live)
    tl.store(ws_ptr + 5 * T + tok, lr, mask=live)
    tl.store(ws_ptr + 6 * T + tok, dref, mask=live)


@triton.jit
def _rows_grad_kernel(logits_ptr, ids_ptr, grad_ptr, ws_ptr, flag_ptr, dloss_ptr, tokens, n_items,
                      stride_b, stride_t, seq, vocab, inv_temp,
                      N_ROWS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, FORCE_STATS: tl.constexpr,
                      UPDATE_FLAG: tl.constexpr, BF16: tl.constexpr):
    """members._grad_kernel, one work item per row, ROWS rows per program (n_items unused)."""
    pid = tl.program_id(0)
    c = tl.load(dloss_ptr).to(tl.float32)
    T = tokens.to(tl.int64)
    if UPDATE_FLAG:
        if pid == 0:
            tl.store(flag_ptr, tl.where(c == tl.load(flag_ptr + 1), 0.0, 1.0))
            tl.store(flag_ptr + 1, c)
    if FORCE_STATS:
        from_stats = True
    else:
        from_stats = (tl.load(ws_ptr + 7 * T) > 0.5) | (c != tl.load(ws_ptr + 7 * T + 1))
    if from_stats:
        row = tl.arange(0, ROWS).to(tl.int64) + pid.to(tl.int64) * ROWS
        in_rows = row < N_ROWS
        seq1 = seq.to(tl.int64) + 1
        b = tl.where(in_rows, row // seq1, 0)
        t = row % seq1
        token = b * seq + t
        scored = in_rows & (t < seq)
        coef = tl.load(ws_ptr + 3 * T + token, mask=scored, other=0.0) * c
        work = coef != 0.0  # masked, clipped and last rows: zeros, logits unread
        tok = tl.where(work, token, 0)
        m = tl.load(ws_ptr + tok, mask=work, other=0.0)
        log_s = tl.load(ws_ptr + T + tok, mask=work, other=0.0)
        target = tl.load(ids_ptr + tok, mask=work, other=0)
        row_ptrs = logits_ptr + b.to(tl.int64) * stride_b + t.to(tl.int64) * stride_t
        grad_rows = grad_ptr + row * vocab
        for v0 in range(0, vocab, BLOCK):
            offs = tl.arange(0, BLOCK).to(tl.int64) + v0
            inside = offs < vocab
            x = _load_f32(row_ptrs[:, None] + offs[None, :], work[:, None] & inside[None, :], 0.0, BF16)
            p = tl.exp((x - m[:, None]) * inv_temp - log_s[:, None])
            g = coef[:, None] * (p - tl.where(offs[None, :] == target[:, None], 1.0, 0.0))
            g = tl.where(work[:, None], g, 0.0)
            _store_grad(grad_rows[:, None] + offs[None, :], g, in_rows[:, None] & inside[None, :], BF16)


@triton.jit
def _rows_norm_kernel(mask_ptr, rho_ptr, wb_ptr, rb_ptr, batch, seq, GLOBAL: tl.constexpr, WRITE_W: tl.constexpr,
                      SEQ_RHO: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_T: tl.constexpr, BATCH_P2: tl.constexpr):
    """members._norm_kernel with every sequence at once (a [BATCH_P2, BLOCK_T] tile)."""
    b = tl.arange(0, BATCH_P2).to(tl.int64)  # int64: no overflow checks to interpret
    in_b = b < batch
    n = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    lq = tl.zeros([BATCH_P2, BLOCK_T], tl.float64)
    for t0 in range(0, seq, BLOCK_T):
        t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
        idx = b[:, None] * seq + t[None, :]
        live = in_b[:, None] & (t[None, :] < seq)
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + idx, mask=live, other=0) != 0)
        n += tl.where(live, 1.0, 0.0)
        if SEQ_RHO:
            q = tl.load(rho_ptr + idx, mask=live, other=1.0).to(tl.float32)
            lq += tl.where(live, tl.log(q), 0.0).to(tl.float64)
    n_b = tl.sum(n, axis=1)
    if SEQ_RHO:
        tl.store(rb_ptr + b, tl.exp(tl.sum(lq, axis=1).to(tl.float32)), mask=in_b)
    if WRITE_W:
        if GLOBAL:
            total = tl.sum(n_b, axis=0)  # whole counts: exact in any order
            tl.store(wb_ptr + b, tl.zeros([BATCH_P2], tl.float32) + 1.0 / tl.maximum(total, 1.0), mask=in_b)
        else:
            tl.store(wb_ptr + b, 1.0 / (batch * tl.maximum(n_b, 1.0)), mask=in_b)


@triton.jit
def _rows_terms_kernel(ws_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, rb_ptr, loss_ptr,
                       batch, seq, tokens, inv_temp, inv_lo, eps_low, eps_high, delta, beta, cap, w_const,
                       vk_pos, vl_pos, vk_neg, vl_neg,
                       HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RHO: tl.constexpr,
                       HAS_DELTA: tl.constexpr, HAS_CAP: tl.constexpr, CISPO: tl.constexpr, KL_BC: tl.constexpr,
                       RHO_MASK: tl.constexpr, SEQ_RHO: tl.constexpr, SAPO: tl.constexpr, NEEDS_LOGP: tl.constexpr,
                       NORM: tl.constexpr, SEQUENCE: tl.constexpr, VESPO: tl.constexpr, WRITE_COEF: tl.constexpr,
                       BLOCK_T: tl.constexpr, BATCH_P2: tl.constexpr):
    """members._terms_kernel with every sequence at once: its loop over b is the tile's first axis
    ([BATCH_P2, BLOCK_T]), the loss accumulated per (sequence, lane) and summed over the sequences in
    order, then over the lanes (the plain kernel's order where a sequence fits one block)."""
    b = tl.arange(0, BATCH_P2).to(tl.int64)  # int64: no overflow checks to interpret
    in_b = b < batch
    b_safe = tl.where(in_b, b, 0)
    T = tokens.to(tl.int64)
    adv = tl.load(adv_ptr + b_safe).to(tl.float32)
    n_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    lr_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    rho_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    if HAS_MASK or SEQUENCE or VESPO:
        for t0 in range(0, seq, BLOCK_T):
            t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
            idx = b[:, None] * seq + t[None, :]
            live = in_b[:, None] & (t[None, :] < seq)
            if HAS_MASK:
                live = live & (tl.load(mask_ptr + idx, mask=live, other=0) != 0)
            n_acc += tl.where(live, 1.0, 0.0)
            if SEQUENCE:
                lr_acc += tl.where(live, tl.load(ws_ptr + 5 * T + idx, mask=live, other=0.0), 0.0)
            if VESPO:
                if HAS_OLD:
                    lr_t = tl.load(ws_ptr + 5 * T + idx, mask=live, other=0.0)
                    lr_acc += tl.where(live, tl.minimum(tl.maximum(lr_t, -20.0), 20.0), 0.0)
                if HAS_RHO:
                    rho = tl.load(rho_ptr + idx, mask=live, other=0.0).to(tl.float32)
                    if HAS_CAP:
                        if RHO_MASK:
                            rho = tl.where(rho > cap, 0.0, rho)
                        else:
                            rho = tl.minimum(rho, cap)
                    rho_acc += tl.where(live, rho, 0.0)
    n_b = tl.sum(n_acc, axis=1)
    if NORM == 1 and HAS_MASK:
        wb = 1.0 / (batch * tl.maximum(n_b, 1.0))
    elif NORM == 2 and HAS_MASK:
        wb = tl.zeros([BATCH_P2], tl.float32) + 1.0 / tl.maximum(tl.sum(n_b, axis=0), 1.0)
    else:
        wb = tl.zeros([BATCH_P2], tl.float32) + w_const
    loss_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    seq_coef = tl.zeros([BATCH_P2], tl.float32)
    phi = tl.zeros([BATCH_P2], tl.float32)
    if VESPO:
        u = tl.minimum(tl.maximum(tl.sum(lr_acc, axis=1), -18.420680743952367), 20.0)
        k_b = tl.where(adv >= 0, vk_pos, vk_neg)
        lam_b = tl.where(adv >= 0, vl_pos, vl_neg)
        phi = tl.exp(lam_b + k_b * u - lam_b * tl.exp(u))
        phi = tl.where(tl.abs(phi) < float("inf"), phi, 0.0)
    if SEQUENCE:
        mean_lr = tl.sum(lr_acc, axis=1) / tl.maximum(n_b, 1.0)
        l_s, dl_s = _policy_terms(mean_lr, mean_lr, adv, eps_low, eps_high, delta, HAS_DELTA, False, False)
        if HAS_RHO:
            weight_sum = wb * tl.sum(rho_acc, axis=1)
        else:
            weight_sum = wb * n_b
        first = (tl.arange(0, BLOCK_T) == 0)[None, :] & in_b[:, None]
        loss_acc += tl.where(first, (l_s * weight_sum)[:, None], 0.0)
        seq_coef = dl_s * weight_sum / tl.maximum(n_b, 1.0)
    for t0 in range(0, seq, BLOCK_T):
        t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
        token = b[:, None] * seq + t[None, :]
        inside = in_b[:, None] & (t[None, :] < seq)
        live = inside
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + token, mask=inside, other=0) != 0)
        tok = tl.where(live, token, 0)
        if NEEDS_LOGP:
            logp = tl.load(ws_ptr + 2 * T + tok, mask=live, other=0.0)
            lr = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
            if HAS_OLD:
                lr = tl.load(ws_ptr + 5 * T + tok, mask=live, other=0.0)
            dref = tl.load(ws_ptr + 6 * T + tok, mask=live, other=0.0)
        else:
            logp = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
            lr = logp
            dref = logp
        if SEQUENCE:
            dlogp = tl.zeros([BATCH_P2, BLOCK_T], tl.float32) + seq_coef[:, None]
            if HAS_KL:
                kl, dkl = _kl_terms(dref, beta)
                loss_acc += tl.where(live, kl * wb[:, None], 0.0)
                dlogp = dlogp + dkl * wb[:, None]
        elif VESPO:
            loss = -phi[:, None] * adv[:, None] * logp
            dlogp = tl.zeros([BATCH_P2, BLOCK_T], tl.float32) - (phi * adv)[:, None]
            if HAS_KL:
                kl, dkl = _kl_terms(dref, beta)
                loss = loss + kl
                dlogp = dlogp + dkl
            loss_acc += tl.where(live, loss * wb[:, None], 0.0)
            dlogp = dlogp * wb[:, None]
        else:
            if SEQ_RHO:
                q_ptr = rb_ptr
                q_idx = b_safe[:, None]
            else:
                q_ptr = rho_ptr
                q_idx = tok
            loss, dlogp = _token_terms(logp, lr, dref, q_idx, adv[:, None], wb[:, None], q_ptr, eps_low, eps_high,
                                       delta, beta, cap, HAS_KL, HAS_RHO, HAS_DELTA, HAS_CAP, CISPO, KL_BC, RHO_MASK,
                                       SAPO)
            loss_acc += tl.where(live, loss, 0.0)
        if WRITE_COEF:
            tl.store(ws_ptr + 3 * T + token, tl.where(live, -dlogp * inv_temp, 0.0), mask=inside)
    tl.store(loss_ptr, tl.sum(tl.sum(loss_acc, axis=0), axis=0))


class _Bits:
    """A launch whose bfloat16 tensors (at `positions` of its arguments) travel as their int16 views."""

    __slots__ = ("launch", "positions")

    def __init__(self, launch, positions):
        self.launch, self.positions = launch, positions

    def __call__(self, stream, *args):
        args = list(args)
        for i in self.positions:
            args[i] = args[i].view(torch.int16)
        self.launch(stream, *args)


def launches(plan, Launch) -> None:
    """Replace a plan's row-per-program launches (stats, main, grad) with the row-blocked twins, and its
    one-program loops over the sequences (terms, norm) with their tiled twins."""
    s = plan.sem
    sw = dict(plan.switches)
    bf16 = plan.dtype == torch.bfloat16
    main = dict(shape(plan.rows, plan.vocab), BF16=bf16)
    stats = dict(shape(plan.tokens, plan.vocab), BF16=bf16)

    def bits(launch, *positions):
        return _Bits(launch, positions) if bf16 else launch

    plan.l_stats = bits(Launch(_rows_stats_kernel, (triton.cdiv(max(1, plan.tokens), stats["ROWS"]),),
                               dict(**stats, HAS_MASK=s.has_mask, HAS_OLD=s.has_old, HAS_KL=s.has_kl), {}, False), 0)
    main_grid = (triton.cdiv(plan.rows, main["ROWS"]),)
    plan.l_main = [bits(Launch(_rows_main_kernel, main_grid, dict(N_ROWS=plan.rows, **main, **sw,
                                                                  PER_SEQ_W=s.norm != 0, IN_BACKWARD=bwd), {}, False),
                        0, 9) for bwd in (False, True)]
    plan.l_grad = [bits(Launch(_rows_grad_kernel, main_grid, dict(N_ROWS=plan.rows, **main, FORCE_STATS=f or s.coupled,
                                                                  UPDATE_FLAG=not s.coupled), {}, False), 0, 2)
                   for f in (False, True)]
    batch_p2 = triton.next_power_of_2(plan.batch)
    if batch_p2 * plan.block_t <= TILE:  # else the plain one-program kernels (a loop over the sequences)
        plan.l_terms = [Launch(_rows_terms_kernel, (1,), dict(**sw, NEEDS_LOGP=s.needs_logp, NORM=s.norm,
                                                             SEQUENCE=s.sequence, VESPO=s.vespo, WRITE_COEF=w,
                                                             BLOCK_T=plan.block_t, BATCH_P2=batch_p2), {}, False)
                        for w in (False, True)]
        plan.l_norm = Launch(_rows_norm_kernel, (1,), dict(GLOBAL=s.norm == 2, WRITE_W=s.norm != 0, SEQ_RHO=s.seq_rho,
                                                           HAS_MASK=s.has_mask, BLOCK_T=plan.block_t,
                                                           BATCH_P2=batch_p2), {}, False)


class InterpPlan(Plan):
    """The plan of an interpreted call (impl.py picks it when interpreting with `interp_rows`): as
    Plan, and the forward of a token-level member in one launch where one program holds every row
    (`_rows_main_kernel` FUSED: no _norm_kernel or _finalize_kernel launch, ~25% of such a call's
    interpreted operations at the CPU tier's shapes). Members with per-sequence sampling ratios (their
    norm launch computes them), coupled and deferred members keep Plan's forward."""

    def _launches(self) -> None:
        super()._launches()
        self.l_fused = None
        s = self.sem
        if not (self.tuning.interp_rows and interpreting()) or self.deferred or s.coupled or s.seq_rho:
            return
        main = shape(self.rows, self.vocab)
        seq_p2 = triton.next_power_of_2(max(1, self.seq))
        tok_p2 = triton.next_power_of_2(max(1, self.tokens))
        if main["ROWS"] < self.rows or main["ROWS"] * seq_p2 > TILE or tok_p2 > TILE:
            return
        bf16 = self.dtype == torch.bfloat16
        launch = fastlaunch.Launch(_rows_main_kernel, (1,), dict(
            N_ROWS=self.rows, **main, BF16=bf16, **self.switches, PER_SEQ_W=s.norm != 0, IN_BACKWARD=False,
            FUSED=True, GLOBAL_W=s.norm == 2, BATCH=self.batch, SEQ_P2=seq_p2, TOK_P2=tok_p2,
            FIN_BLOCK=1024), {}, False)
        self.l_fused = _Bits(launch, (0, 9)) if bf16 else launch

    def forward_full(self, x):
        if self.l_fused is None:
            return super().forward_full(x)
        logits, ids, adv, old, ref, mask, rho = x
        loss = torch.empty((), dtype=torch.float32, device=self.device)
        grad = torch.empty(self.grad_shape, dtype=self.dtype, device=self.device)
        ws = self._ws()
        self.l_fused(self.stream, logits, ids, adv, old, ref, mask, rho, adv, adv, grad, self.partials, loss, ws,
                     self.flag, self.tokens, self.stride_b, self.stride_t, self.seq, self.vocab, *self.term_args)
        return loss, grad, ws


def use_interpreter_shim() -> bool:
    """Patch `triton.language` once per launch instead of once per nested call (module docstring).
    Idempotent; returns whether the shim is on."""
    try:
        from triton.runtime import interpreter as itp
    except ImportError:
        return False
    executor = getattr(itp, "GridExecutor", None)
    needed = ("_patch_lang", "_patch_builtin", "_patch_attr", "_LangPatchScope")
    if executor is None or not all(hasattr(itp, n) for n in needed) or not hasattr(tl.core, "is_builtin"):
        return False
    if getattr(executor.__call__, "grpo_shim", False):
        return True
    original_patch, original_call, held = itp._patch_lang, executor.__call__, [False]
    # A function that sees both modules the interpreter patches (tl and tl.core): one patch covers
    # every nested helper, ours and triton.language.standard's (tl.sum, tl.max, tl.zeros, ...).
    both = types.FunctionType((lambda: None).__code__, {"tl": tl, "core": tl.core})
    builtins: dict = {}

    def _patch_builtin(pkg, builder, scope):
        """The interpreter's own, with the module's builtin names listed once (inspect.getmembers on
        every patch was most of its cost)."""
        names = builtins.get(id(pkg))
        if names is None:
            names = builtins[id(pkg)] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names:
            member = getattr(pkg, name, None)
            if tl.core.is_builtin(member):
                itp._patch_attr(pkg, name, member, builder, scope)

    def _patch_lang(fn):
        if held[0]:  # inside a launch that patched tl and tl.core: a second patch changes nothing
            return itp._LangPatchScope()
        return original_patch(fn)

    def __call__(self, *args, **kwargs):
        if held[0]:
            return original_call(self, *args, **kwargs)
        scope = original_patch(both)
        held[0] = True
        try:
            return original_call(self, *args, **kwargs)
        finally:
            held[0] = False
            scope.restore()

    __call__.grpo_shim = True
    itp._patch_builtin, itp._patch_lang, executor.__call__ = _patch_builtin, _patch_lang, __call__
    return True
