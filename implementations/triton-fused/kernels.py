"""Triton kernels of the fused linear + GRPO loss, over one chunk of logits rows [rows, vocab].

A chunk holds the logits of rows row0 .. row0 + rows - 1 of the flattened [B * T] grid (token = row0
+ local row; b = token // T): cuBLAS wrote them (hidden_c @ weight.T, + bias) into a buffer whose
rows are `stride_x` elements apart. Each kernel below reads that chunk; the gradient kernels write
d loss / d logits over it in place (g_ptr = x_ptr: the logits are dead once their row's gradient
exists), so a chunk costs one buffer; with float32 logits (FusedSettings.logits) into a separate
buffer in the weight's dtype (g_ptr, rows `stride_g` apart). Helpers (_chunk_stats, _combine,
_differences, _token_terms, ...) are those of
implementations/triton (vendored.py holds exact copies).

  _rows_kernel       token-level members. Programs per row: SPLIT (chunk index fastest); each takes
                     (max, sum) of its piece, reads the target logit, then (SPLIT > 1) publishes its
                     partials and waits for the row's other pieces (arrival counters zeroed per
                     launch), combines, and writes c * coef * (p - onehot) over its own piece: its
                     piece is read twice, the second time from L2. The target logit is read before
                     the arrival, so the piece that holds it may be overwritten afterwards. Masked
                     rows: loss 0, gradient row 0, logits never read. WRITE_GRAD False: the loss only.
                     NEEDS_LOGP False (forward-only members whose loss does not read the logits,
                     token-is: the ratio is exactly 1): no logits at all. GIVEN (forward-only calls on
                     CUDA): the staged sweep of staged.py took each row's (max, ln S) already.
  _stats_kernel      one program per row: (max, ln S), logp and its two float64-formed differences
                     (logp - old, ref - logp) into the per-call `ws` ([6, N] float32); with
                     LOGP_ONLY just logp (the reference model's log-probs through a reference weight).
  _sequence_kernel   sequence-level members (GSPO): one program per sequence of the chunk (chunks
                     hold whole sequences): the mean log-ratio, the clipped sequence term, the k3 KL
                     per token; per-token loss and the coefficient coef = -(dL/dlogp) / T into ws.
  _coef_grad_kernel  in place: c * coef * (p - onehot) from ws's (max, ln S, coef), one program per
                     (row, piece) with no waiting; rows with coef 0 are written as zeros, unread.
  _rescale_kernel    backward: where the upstream scalar differs from the one the forward folded
                     in, the gradient times their ratio; else nothing (every program exits).
"""

import triton
import triton.language as tl

from .vendored import _chunk_stats, _combine, _differences, _kl_terms, _policy_terms, _token_terms


@triton.jit
def _row_gradient(row_ptr, grow_ptr, start, stop, vocab, m, log_s, inv_temp, coef, target, BLOCK: tl.constexpr):
    """coef * (p - onehot) over [start, stop) of one row, written at grow_ptr (the row itself, or the row of
    a separate gradient buffer where the logits are float32)."""
    for v0 in range(start, stop, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        inside = (offs < stop) & (offs < vocab)
        x = tl.load(row_ptr + offs, mask=inside, other=0.0)
        p = tl.exp((x.to(tl.float32) - m) * inv_temp - log_s)
        g = coef * (p - tl.where(offs == target, 1.0, 0.0))
        tl.store(grow_ptr + offs, g.to(grow_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _row_zeros(grow_ptr, start, stop, vocab, BLOCK: tl.constexpr):
    for v0 in range(start, stop, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        tl.store(grow_ptr + offs, tl.zeros([BLOCK], dtype=grow_ptr.dtype.element_ty), mask=(offs < stop) & (offs < vocab))


@triton.jit
def _rows_kernel(x_ptr, g_ptr, ids_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, wb_ptr, c_ptr, loss_ptr, part_ptr, count_ptr,
                 row0, rows, seq, vocab, stride_x, stride_g, inv_temp, inv_lo, eps_low, eps_high, delta, beta, w_const,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                 HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DELTA: tl.constexpr,
                 CISPO: tl.constexpr, KL_BC: tl.constexpr, SAPO: tl.constexpr, PER_SEQ_W: tl.constexpr,
                 NEEDS_LOGP: tl.constexpr, WRITE_GRAD: tl.constexpr, HINTS: tl.constexpr, STAGES: tl.constexpr,
                 VECTOR: tl.constexpr, GIVEN: tl.constexpr, TARGET_GIVEN: tl.constexpr):
    """HINTS (CUDA): the first sweep keeps the piece in L2 (evict_last) for the gradient's sweep.
    STAGES / VECTOR: the first sweep's software pipelining (blocks in flight per program) and per-lane
    running (max, sum) with no block-wide reduction inside the loop (vendored._chunk_stats); the
    forward-only sweep's settings (FusedSettings.forward_sweep), 1 / False where the gradient follows.
    GIVEN (forward-only, SPLIT 1): the staged sweep (staged.py) already stored each live row's max at
    part_ptr[r] and ln S at part_ptr[rows + r]; no sweep here, only the target logit is read. TARGET_GIVEN
    (with GIVEN: the epilogue GEMM of epilogue.py, which never writes the logits): the target logit too, at
    part_ptr[2 rows + r]; x_ptr is not read at all."""
    pid = tl.program_id(0)
    r = pid // SPLIT
    k = pid % SPLIT
    token = row0 + r
    b = token // seq
    start = k * CHUNK
    row_ptr = x_ptr + tl.cast(r, tl.int64) * stride_x
    grow_ptr = g_ptr + tl.cast(r, tl.int64) * stride_g
    live = True
    if HAS_MASK:
        live = tl.load(mask_ptr + token) != 0
    if live:
        target = tl.load(ids_ptr + token)
        if GIVEN:
            m = tl.load(part_ptr + r)
            log_s = tl.load(part_ptr + rows + r)
            if TARGET_GIVEN:
                x_c = tl.load(part_ptr + 2 * rows + r)
            else:
                x_c = tl.load(row_ptr + target).to(tl.float32)
            logp, lr, dref = _differences(x_c, m, log_s, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
        elif NEEDS_LOGP or WRITE_GRAD:
            m, s = _chunk_stats(row_ptr, start, start + CHUNK, vocab, inv_temp, BLOCK, STAGES, HINTS, VECTOR)
            x_c = tl.load(row_ptr + target).to(tl.float32)  # before the arrival: its piece may be overwritten next
            if SPLIT > 1:
                tl.store(part_ptr + r * SPLIT + k, m)
                tl.store(part_ptr + (rows + r) * SPLIT + k, s)
                tl.atomic_add(count_ptr + r, 1, sem="release")
                while tl.atomic_add(count_ptr + r, 0, sem="acquire") < SPLIT:
                    pass
                m, log_s = _combine(part_ptr + r * SPLIT, part_ptr + (rows + r) * SPLIT, inv_temp, SPLIT, SPLIT_P2)
            else:
                log_s = tl.log(s)
            logp, lr, dref = _differences(x_c, m, log_s, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
        else:
            m = tl.full([], 0.0, tl.float32)
            log_s = m
            logp = m
            lr = m
            dref = m
        if PER_SEQ_W:
            w = tl.load(wb_ptr + b)
        else:
            w = w_const
        loss, dlogp = _token_terms(logp, lr, dref, token, tl.load(adv_ptr + b).to(tl.float32), w, adv_ptr,
                                   eps_low, eps_high, delta, beta, 0.0, HAS_KL, False, HAS_DELTA, False, CISPO,
                                   KL_BC, False, SAPO)
        if k == 0:
            tl.store(loss_ptr + token, loss)
        if WRITE_GRAD:
            coef = -dlogp * inv_temp * tl.load(c_ptr)
            _row_gradient(row_ptr, grow_ptr, start, start + CHUNK, vocab, m, log_s, inv_temp, coef, target, BLOCK)
    else:
        if k == 0:
            tl.store(loss_ptr + token, 0.0)
        if WRITE_GRAD:
            _row_zeros(grow_ptr, start, start + CHUNK, vocab, BLOCK)


@triton.jit
def _stats_kernel(x_ptr, ids_ptr, old_ptr, ref_ptr, mask_ptr, ws_ptr, row0, tokens, vocab, stride_x, inv_temp, inv_lo,
                  BLOCK: tl.constexpr, HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr,
                  LOGP_ONLY: tl.constexpr, GIVEN: tl.constexpr, TARGET_GIVEN: tl.constexpr):
    """ws sections ([k * tokens, (k + 1) * tokens)): 0 max, 1 ln S, 2 logp, 3 logp - old, 4 ref - logp;
    LOGP_ONLY: ws_ptr is a [tokens] vector of logp. GIVEN (not with LOGP_ONLY): sections 0 and 1 of the
    live rows hold the staged sweep's max and ln S already (staged.py); no sweep here. TARGET_GIVEN (with
    GIVEN: epilogue.py's GEMM) section 2 holds the target logit (read before logp is stored over it)."""
    r = tl.program_id(0)
    token = row0 + r
    live = True
    if HAS_MASK:
        live = tl.load(mask_ptr + token) != 0
    if live:  # a masked row is never read
        row_ptr = x_ptr + tl.cast(r, tl.int64) * stride_x
        if GIVEN:
            m = tl.load(ws_ptr + token)
            log_s = tl.load(ws_ptr + tokens + token)
        else:
            m, s = _chunk_stats(row_ptr, 0, vocab, vocab, inv_temp, BLOCK, 1, False, False)
            log_s = tl.log(s)
        if TARGET_GIVEN:
            x_c = tl.load(ws_ptr + 2 * tokens + token)
        else:
            x_c = tl.load(row_ptr + tl.load(ids_ptr + token)).to(tl.float32)
        logp, lr, dref = _differences(x_c, m, log_s, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
        if LOGP_ONLY:
            tl.store(ws_ptr + token, logp)
        else:
            tl.store(ws_ptr + token, m)
            tl.store(ws_ptr + tokens + token, log_s)
            tl.store(ws_ptr + 2 * tokens + token, logp)
            tl.store(ws_ptr + 3 * tokens + token, lr)
            tl.store(ws_ptr + 4 * tokens + token, dref)
    elif LOGP_ONLY:
        tl.store(ws_ptr + token, 0.0)


@triton.jit
def _sequence_kernel(ws_ptr, adv_ptr, mask_ptr, wb_ptr, loss_ptr, b0, seq, tokens, inv_temp, eps_low, eps_high,
                     delta, beta, w_const, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DELTA: tl.constexpr,
                     PER_SEQ_W: tl.constexpr, BLOCK_T: tl.constexpr):
    """GSPO: s_b = exp(sum_t m lr / max(1, n_b)); every live token gets l(s_b) * w and
    dL/dlogp = w n_b dl/ds_b / max(1, n_b) (+ the token's KL); coef = -dL/dlogp / T into ws section 5."""
    b = b0 + tl.program_id(0)
    adv = tl.load(adv_ptr + b).to(tl.float32)
    if PER_SEQ_W:
        w = tl.load(wb_ptr + b)
    else:
        w = w_const
    n_acc = tl.zeros([BLOCK_T], tl.float32)
    lr_acc = tl.zeros([BLOCK_T], tl.float32)
    for t0 in range(0, seq, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        live = t < seq
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + b * seq + t, mask=t < seq, other=0) != 0)
        n_acc += tl.where(live, 1.0, 0.0)
        lr_acc += tl.where(live, tl.load(ws_ptr + 3 * tokens + b * seq + t, mask=live, other=0.0), 0.0)
    n_b = tl.sum(n_acc, axis=0)
    mean_lr = tl.sum(lr_acc, axis=0) / tl.maximum(n_b, 1.0)
    l_s, dl_s = _policy_terms(mean_lr, mean_lr, adv, eps_low, eps_high, delta, HAS_DELTA, False, False)
    seq_coef = dl_s * w * n_b / tl.maximum(n_b, 1.0)
    for t0 in range(0, seq, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        token = b * seq + t
        live = t < seq
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + token, mask=t < seq, other=0) != 0)
        loss = tl.zeros([BLOCK_T], tl.float32) + l_s * w
        dlogp = tl.zeros([BLOCK_T], tl.float32) + seq_coef
        if HAS_KL:
            kl, dkl = _kl_terms(tl.load(ws_ptr + 4 * tokens + token, mask=live, other=0.0), beta)
            loss = loss + kl * w
            dlogp = dlogp + dkl * w
        tl.store(loss_ptr + token, tl.where(live, loss, 0.0), mask=t < seq)
        tl.store(ws_ptr + 5 * tokens + token, tl.where(live, -dlogp * inv_temp, 0.0), mask=t < seq)


@triton.jit
def _coef_grad_kernel(x_ptr, g_ptr, ids_ptr, ws_ptr, c_ptr, row0, tokens, vocab, stride_x, stride_g, inv_temp,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    r = pid // SPLIT
    start = (pid % SPLIT) * CHUNK
    token = row0 + r
    row_ptr = x_ptr + tl.cast(r, tl.int64) * stride_x
    grow_ptr = g_ptr + tl.cast(r, tl.int64) * stride_g
    coef = tl.load(ws_ptr + 5 * tokens + token) * tl.load(c_ptr)
    if coef != 0.0:  # masked and clipped rows: zeros, logits unread
        m = tl.load(ws_ptr + token)
        log_s = tl.load(ws_ptr + tokens + token)
        _row_gradient(row_ptr, grow_ptr, start, start + CHUNK, vocab, m, log_s,
                      inv_temp, coef, tl.load(ids_ptr + token), BLOCK)
    else:
        _row_zeros(grow_ptr, start, start + CHUNK, vocab, BLOCK)


@triton.jit
def _rescale_kernel(x_ptr, n, c_used_ptr, dloss_ptr, BLOCK: tl.constexpr):
    """x *= dloss / c_used where they differ (a persistent grid; nothing when they are equal)."""
    c_used = tl.load(c_used_ptr)
    d = tl.load(dloss_ptr)
    if d != c_used:
        ratio = d / c_used
        for i0 in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
            offs = i0 + tl.arange(0, BLOCK)
            inside = offs < n
            x = tl.load(x_ptr + offs, mask=inside, other=0.0)
            tl.store(x_ptr + offs, (x.to(tl.float32) * ratio).to(x_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _acc_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    """c[M, N] (float32) += a[M, K] @ b[K, N] (bf16/fp16 operands, float32 accumulation): d weight's
    accumulator where cuBLAS cannot take a float32 C with bf16 operands (accumulator.accumulate_fp32). Tiles in
    groups of GROUP_M rows so that consecutive programs share b's tiles in L2. UPCAST (the interpreter only,
    whose tl.dot misreads bf16): the tiles in float32 (bf16 values are exact in float32)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    # int32 offsets: every product stays below 2^31 at V 128256, H 4096 and chunks of up to 8192 rows
    a_ptrs = a_ptr + (rm[:, None] % M) * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + (rn[None, :] % N) * s_bn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    c_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptrs, tl.load(c_ptrs, mask=inside, other=0.0) + acc, mask=inside)
