"""Row-blocked interpreter twins of members.py's per-row kernels (main, statistics, backward): ROWS
logits rows per program as 2-D tiles. Interpreter only (interp.py says why and how they are launched);
each kernel's docstring names its plain twin.
"""

import triton
import triton.language as tl

from .members import _differences, _token_terms


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
                      TOK_P2: tl.constexpr = 1, FIN_BLOCK: tl.constexpr = 1024, ONE_BLOCK: tl.constexpr = False):
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
    if ONE_BLOCK:  # the row in one block: _rows_stats_pass's arithmetic, the block kept for the gradient
        offs = tl.arange(0, BLOCK).to(tl.int64)
        inside = offs < vocab
        x = _load_f32(row_ptrs[:, None] + offs[None, :], live[:, None] & inside[None, :], -float("inf"), BF16)
        m = tl.max(x, axis=1)
        m_use = tl.where(live, m, 0.0)
        s = tl.sum(tl.exp((x - tl.where(m > -float("inf"), m, 0.0)[:, None]) * inv_temp), axis=1)
        log_s = tl.log(tl.where(live, s, 1.0))
    else:
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
        if ONE_BLOCK:  # x of the statistics (-inf outside the row and on rows not live: p = 0 there)
            p = tl.exp((x - m_use[:, None]) * inv_temp - log_s[:, None])
            g = coef_g[:, None] * (p - tl.where(offs[None, :] == target[:, None], 1.0, 0.0))
            g = tl.where(live[:, None], g, 0.0)
            _store_grad(grad_rows[:, None] + offs[None, :], g, in_rows[:, None] & inside[None, :], BF16)
        else:
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
