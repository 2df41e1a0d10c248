"""Shared-memory staged kernels (Gluon, NVIDIA sm_80+) of the members (launched by staged_members.py):
each chunk of a row crosses DRAM once.

_staged_member_kernel (loss and gradient): a row is split into NUM_CHUNKS chunks; program (row, k)
copies chunk k straight from global to shared memory with cp.async (every block of the chunk in
flight at once), reduces it to (max, sum of 2^(z - max)) block by block as the copies land,
publishes that pair, waits for the row's other chunks (an atomic arrival counter), and writes its
part of the gradient from shared memory. The second sweep never touches L2 or DRAM: a plain-Triton
split kernel's second sweep depends on L2 holding every row in flight, which it cannot promise.

_staged_stats_kernel (statistics only): the same copy and reduction; the last program of a token to
finish combines (nobody waits).

A block is held as [REPS, THREADS, VEC]: thread t owns VEC contiguous elements in each of REPS
rows, so a warp's copies are contiguous 16-byte pieces. THREAD_STATS keeps one running
(max, sum) per thread, reduced across threads once per chunk (no barrier per block); otherwise
every block is reduced across the CTA as it lands. Exponentials are exp2((x - max) * log2(e) / T):
one per element per sweep, and the max is kept in the logits' own units with log2 of the sum
beside it, never folded into one number. (Folding them, lse2 = max * log2(e) + log2(sum), lost
the row's scale in fp32 rounding: a row whose largest logit is 413696 (Student-t row of the
spec) got 0.98x its gradient on the H200, round 7; x - max is exact for bf16/fp16 logits.)
Only a row's last chunk is masked; the
one-hot term is applied by the target's program after its sweep (a CTA barrier orders the two
stores), so the sweeps have no compare/select per element.

Gluon is Triton's lower-level dialect (explicit layouts and shared memory); it does not run under
TRITON_INTERPRET=1, so plan.py uses it only on CUDA and keeps the plain kernels (members.py) for the rest.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

LN2 = gl.constexpr(0.6931471805599453)
PAD = gl.constexpr(-1.0e30)  # finite padding: a thread whose elements are all padding keeps s * 2^(PAD - m) = 0


@gluon.jit
def _block_offsets(REPS: gl.constexpr, THREADS: gl.constexpr, VEC: gl.constexpr, layout: gl.constexpr):
    """Element offsets of one [REPS, THREADS, VEC] block, in `layout`."""
    r = gl.arange(0, REPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    t = gl.arange(0, THREADS, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    v = gl.arange(0, VEC, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    r3 = gl.expand_dims(gl.expand_dims(r, 1), 2) * (THREADS * VEC)
    t3 = gl.expand_dims(gl.expand_dims(t, 0), 2) * VEC
    v3 = gl.expand_dims(gl.expand_dims(v, 0), 1)
    return r3 + t3 + v3


@gluon.jit
def _copy_chunk(stage, row_ptr, start, vocab, lanes, NBLK: gl.constexpr, BLOCK: gl.constexpr, MASKED: gl.constexpr):
    for i in gl.static_range(NBLK):  # every copy of the chunk in flight at once
        offs = start + i * BLOCK + lanes
        if MASKED:
            async_copy.async_copy_global_to_shared(stage.index(i), row_ptr + offs, mask=offs < vocab)
        else:
            async_copy.async_copy_global_to_shared(stage.index(i), row_ptr + offs)
        async_copy.commit_group()


@gluon.jit
def _chunk_stats(stage, start, vocab, scale2, lanes, layout: gl.constexpr, NBLK: gl.constexpr,
                 BLOCK: gl.constexpr, THREADS: gl.constexpr, MASKED: gl.constexpr, THREAD_STATS: gl.constexpr):
    """(max of x, sum of 2^((x - max) * scale2)) over the staged chunk, block by block as the copies land."""
    tl_layout: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, layout))
    m_t = gl.full([THREADS], PAD, gl.float32, tl_layout)
    s_t = gl.zeros([THREADS], gl.float32, tl_layout)
    m = PAD
    s = 0.0
    for i in gl.static_range(NBLK):
        async_copy.wait_group(NBLK - 1 - i)
        gl.thread_barrier()  # other threads' copies of this block have landed too
        x = stage.index(i).load(layout).to(gl.float32)
        if MASKED:
            x = gl.where(start + i * BLOCK + lanes < vocab, x, PAD)
        if THREAD_STATS:
            m_new = gl.maximum(m_t, gl.max(gl.max(x, axis=2), axis=0))
            e = gl.exp2((x - gl.expand_dims(gl.expand_dims(m_new, 0), 2)) * scale2)
            s_t = s_t * gl.exp2((m_t - m_new) * scale2) + gl.sum(gl.sum(e, axis=2), axis=0)
            m_t = m_new
        else:
            m_new = gl.maximum(m, gl.max(gl.max(gl.max(x, axis=2), axis=0), axis=0))
            e = gl.sum(gl.sum(gl.sum(gl.exp2((x - m_new) * scale2), axis=2), axis=0), axis=0)
            s = s * gl.exp2((m - m_new) * scale2) + e
            m = m_new
    if THREAD_STATS:
        m = gl.max(m_t, axis=0)
        s = gl.sum(s_t * gl.exp2((m_t - m) * scale2), axis=0)
    return m, s


@gluon.jit
def _combine2(m_ptr, s_ptr, scale2, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr):
    """A token's (max, log2 of its sum) from its chunks' pairs, read past L1 (other programs wrote them)."""
    small: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    k = gl.arange(0, CHUNKS_P2, layout=small)
    km = k < NUM_CHUNKS
    ms = gl.load(m_ptr + k, mask=km, other=PAD, volatile=True)
    ss = gl.load(s_ptr + k, mask=km, other=0.0, volatile=True)
    m = gl.max(ms, axis=0)
    return m, gl.log2(gl.sum(ss * gl.exp2((ms - m) * scale2), axis=0))


@gluon.jit
def _write_grad(stage, grad_row, start, vocab, scale2, m, l2, coef, lanes, layout: gl.constexpr,
                NBLK: gl.constexpr, BLOCK: gl.constexpr, MASKED: gl.constexpr):
    for i in gl.static_range(NBLK):
        offs = start + i * BLOCK + lanes
        x = stage.index(i).load(layout).to(gl.float32)
        g = (coef * gl.exp2((x - m) * scale2 - l2)).to(grad_row.dtype.element_ty)
        if MASKED:
            gl.store(grad_row + offs, g, mask=offs < vocab, cache_modifier=".cs")
        else:
            gl.store(grad_row + offs, g, cache_modifier=".cs")


@gluon.jit
def _member_differences(x_c, m, l2, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD: gl.constexpr,
                        HAS_KL: gl.constexpr):
    """members._differences: (logp, logp - old, ref - logp), the differences formed in float64."""
    inv64 = inv_temp.to(gl.float64) + inv_lo.to(gl.float64)
    logp64 = (x_c.to(gl.float64) - m.to(gl.float64)) * inv64 - l2.to(gl.float64) * LN2
    logp = logp64.to(gl.float32)
    lr = logp - logp
    if HAS_OLD:
        lr = (logp64 - gl.load(old_ptr + token).to(gl.float64)).to(gl.float32)
    dref = lr
    if HAS_KL:
        dref = (gl.load(ref_ptr + token).to(gl.float64) - logp64).to(gl.float32)
    return logp, lr, dref


@gluon.jit
def _member_terms(logp, lr, dref, token, adv, w, rho_ptr, eps_low, eps_high, delta, beta, cap,
                  HAS_KL: gl.constexpr, HAS_RHO: gl.constexpr, HAS_DELTA: gl.constexpr, HAS_CAP: gl.constexpr,
                  CISPO: gl.constexpr, KL_BC: gl.constexpr, RHO_MASK: gl.constexpr, SAPO: gl.constexpr):
    """Weighted (loss, dL/dlogp) of one token at log-ratio lr; ties pick the unclipped branch. SAPO:
    eps_low / eps_high are the gate temperatures (members._policy_terms)."""
    ratio = gl.exp(lr)
    if CISPO:
        cw = gl.minimum(ratio, eps_high)
        loss = -cw * adv * logp
        dlogp = -cw * adv
    elif SAPO:
        tau = gl.where(adv > 0, eps_low, eps_high)
        x = tau * (ratio - 1.0)
        e = gl.exp(-gl.maximum(x, -x))  # |x| with the calls the seed kernels use (triton 3.6 Gluon)
        s = gl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        loss = -(4.0 / tau) * s * adv
        dlogp = -4.0 * (e / ((1.0 + e) * (1.0 + e))) * ratio * adv
    else:
        c1 = ratio
        if HAS_DELTA:
            c1 = gl.minimum(ratio, delta)
        c2 = gl.minimum(gl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
        loss = -gl.minimum(c1 * adv, c2 * adv)
        full = -adv * ratio
        if HAS_DELTA:
            first = gl.where(ratio <= delta, full, 0.0)
        else:
            first = full
        second = gl.where(ratio >= 1.0 - eps_low, gl.where(ratio <= 1.0 + eps_high, full, 0.0), 0.0)
        dlogp = gl.where(c2 * adv >= c1 * adv, first, second)
    if HAS_RHO:
        rho = gl.load(rho_ptr + token).to(gl.float32)
        if HAS_CAP:
            if RHO_MASK:
                rho = gl.where(rho > cap, 0.0, rho)
            else:
                rho = gl.minimum(rho, cap)
        loss = loss * rho
        dlogp = dlogp * rho
    if HAS_KL:
        e = gl.exp(dref)
        if KL_BC:
            loss = loss + beta * (e - dref - 1.0) * ratio
            dlogp = dlogp - beta * ratio * dref
        else:
            loss = loss + beta * (e - dref - 1.0)
            dlogp = dlogp + beta * (1.0 - e)
    return loss * w, dlogp * w


@gluon.jit
def _zero_chunk(grad_row, start, vocab, lanes, layout: gl.constexpr, NBLK: gl.constexpr, BLOCK: gl.constexpr,
                REPS: gl.constexpr, THREADS: gl.constexpr, VEC: gl.constexpr):
    for i in gl.static_range(NBLK):
        offs = start + i * BLOCK + lanes
        gl.store(grad_row + offs, gl.zeros([REPS, THREADS, VEC], grad_row.dtype.element_ty, layout), mask=offs < vocab)


@gluon.jit
def _staged_member_kernel(
    logits_ptr, ids_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, wb_ptr, rb_ptr, grad_ptr, m_ptr, s_ptr,
    count_ptr, ws_ptr, flag_ptr, tokens, stride_b, stride_t, seq, vocab, scale2, inv_temp, inv_lo, eps_low, eps_high, delta,
    beta, cap, w_const,
    CHUNK: gl.constexpr, BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr,
    VEC: gl.constexpr, THREAD_STATS: gl.constexpr, HAS_OLD: gl.constexpr, HAS_KL: gl.constexpr,
    HAS_MASK: gl.constexpr, HAS_RHO: gl.constexpr, HAS_DELTA: gl.constexpr, HAS_CAP: gl.constexpr,
    CISPO: gl.constexpr, KL_BC: gl.constexpr, RHO_MASK: gl.constexpr, SEQ_RHO: gl.constexpr, SAPO: gl.constexpr,
    PER_SEQ_W: gl.constexpr, IN_BACKWARD: gl.constexpr, INTERLEAVE: gl.constexpr,
):
    """members._main_kernel, staged: mode 0 writes c_pred times the gradient, 1 only the statistics
    and terms; IN_BACKWARD (flag_ptr is d loss) always writes the gradient and leaves ws alone.
    INTERLEAVE: consecutive rows of the grid are the same position of successive sequences, so that
    right-padded (masked, write-only) rows run beside unmasked (read + write) ones instead of in
    write-only stretches at the end of each sequence."""
    THREADS: gl.constexpr = 32 * gl.num_warps()
    REPS: gl.constexpr = BLOCK // (THREADS * VEC)
    NBLK: gl.constexpr = CHUNK // BLOCK
    layout: gl.constexpr = gl.BlockedLayout([REPS, 1, VEC], [1, 32, 1], [1, gl.num_warps(), 1], [2, 1, 0])
    stage = gl.allocate_shared_memory(logits_ptr.dtype.element_ty, [NBLK, REPS, THREADS, VEC],
                                      gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    pid = gl.program_id(0)
    row = pid // NUM_CHUNKS
    k = pid % NUM_CHUNKS
    if INTERLEAVE:
        batch = gl.num_programs(0) // NUM_CHUNKS // (seq + 1)
        b = row % batch
        t = row // batch
        row = b * (seq + 1) + t
    else:
        b = row // (seq + 1)
        t = row % (seq + 1)
    start = k * CHUNK
    lanes = _block_offsets(REPS, THREADS, VEC, layout)
    grad_row = grad_ptr + row.to(gl.int64) * vocab
    # `write` and `live` are constexprs where they are constant, so that the frontend drops the
    # branches they rule out: triton 3.6 (the H200's) cannot lower a store in a dead block of an
    # `if` on a constant tensor (a Python literal assigned to a variable is one): LLVM assertion
    # `idx < size()` in ModuleAxisInfoAnalysis::getAlignment under StoreOpConversion (notes, round 8).
    if IN_BACKWARD:
        write: gl.constexpr = True
        c_pred = gl.load(flag_ptr).to(gl.float32)
    else:
        mode = gl.load(flag_ptr)
        c_pred = gl.load(flag_ptr + 1)
        if pid == 0:
            gl.store(ws_ptr + 7 * tokens, mode)
            gl.store(ws_ptr + 7 * tokens + 1, c_pred)
        write = mode == 0.0
    if t == seq:
        if write:
            _zero_chunk(grad_row, start, vocab, lanes, layout, NBLK, BLOCK, REPS, THREADS, VEC)
    else:
        token = b * seq + t
        if HAS_MASK:
            live = gl.load(mask_ptr + token) != 0
        else:
            live: gl.constexpr = True
        if live:
            row_ptr = logits_ptr + b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t
            tail = start + CHUNK > vocab
            if tail:
                _copy_chunk(stage, row_ptr, start, vocab, lanes, NBLK, BLOCK, True)
                m, s = _chunk_stats(stage, start, vocab, scale2, lanes, layout, NBLK, BLOCK, THREADS, True,
                                    THREAD_STATS)
            else:
                _copy_chunk(stage, row_ptr, start, vocab, lanes, NBLK, BLOCK, False)
                m, s = _chunk_stats(stage, start, vocab, scale2, lanes, layout, NBLK, BLOCK, THREADS, False,
                                    THREAD_STATS)
            l2 = gl.log2(s)
            writer = k == 0
            if NUM_CHUNKS > 1:
                gl.store(m_ptr + token * NUM_CHUNKS + k, m)
                gl.store(s_ptr + token * NUM_CHUNKS + k, s)
                if write:  # the gradient follows: wait for the row's other chunks (members.py: counters)
                    arrived = gl.atomic_add(count_ptr + token, 1, sem="release")
                    target_n = (arrived // NUM_CHUNKS + 1) * NUM_CHUNKS
                    while gl.atomic_add(count_ptr + token, 0, sem="acquire") < target_n:
                        pass
                    m, l2 = _combine2(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, scale2, NUM_CHUNKS,
                                      CHUNKS_P2)
                else:  # statistics only: nobody waits, the last chunk to arrive combines
                    arrived = gl.atomic_add(count_ptr + token, 1, sem="acq_rel")
                    writer = arrived % NUM_CHUNKS == NUM_CHUNKS - 1
                    if writer:
                        m, l2 = _combine2(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, scale2,
                                          NUM_CHUNKS, CHUNKS_P2)
            if writer | write:
                target = gl.load(ids_ptr + token)
                x_c = gl.load(row_ptr + target).to(gl.float32)
                logp, lr, dref = _member_differences(x_c, m, l2, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD,
                                                     HAS_KL)
                if PER_SEQ_W:
                    w = gl.load(wb_ptr + b)
                else:
                    w = w_const
                if SEQ_RHO:  # the sequence's sampling ratio (members._norm_kernel)
                    loss, dlogp = _member_terms(logp, lr, dref, b, gl.load(adv_ptr + b).to(gl.float32), w, rb_ptr,
                                                eps_low, eps_high, delta, beta, cap, HAS_KL, HAS_RHO, HAS_DELTA,
                                                HAS_CAP, CISPO, KL_BC, RHO_MASK, SAPO)
                else:
                    loss, dlogp = _member_terms(logp, lr, dref, token, gl.load(adv_ptr + b).to(gl.float32), w,
                                                rho_ptr, eps_low, eps_high, delta, beta, cap, HAS_KL, HAS_RHO,
                                                HAS_DELTA, HAS_CAP, CISPO, KL_BC, RHO_MASK, SAPO)
                coef = -dlogp * inv_temp
                if not IN_BACKWARD:
                    if writer:
                        gl.store(ws_ptr + token, m)
                        gl.store(ws_ptr + tokens + token, l2 * LN2)
                        gl.store(ws_ptr + 2 * tokens + token, logp)
                        gl.store(ws_ptr + 3 * tokens + token, coef)
                        gl.store(ws_ptr + 4 * tokens + token, loss)
                if write:
                    coef_g = coef * c_pred
                    if tail:
                        _write_grad(stage, grad_row, start, vocab, scale2, m, l2, coef_g, lanes, layout, NBLK, BLOCK,
                                    True)
                    else:
                        _write_grad(stage, grad_row, start, vocab, scale2, m, l2, coef_g, lanes, layout, NBLK, BLOCK,
                                    False)
                    if (target >= start) & (target < start + CHUNK):
                        gl.thread_barrier()  # orders the sweep's store of this element before the one-hot fix
                        p_c = gl.exp2((x_c - m) * scale2 - l2)
                        gl.store(grad_row + target, (coef_g * (p_c - 1.0)).to(grad_ptr.dtype.element_ty))
        else:
            if not IN_BACKWARD:
                if k == 0:
                    zero = (token - token).to(gl.float32)
                    gl.store(ws_ptr + 3 * tokens + token, zero)
                    gl.store(ws_ptr + 4 * tokens + token, zero)
            if write:
                _zero_chunk(grad_row, start, vocab, lanes, layout, NBLK, BLOCK, REPS, THREADS, VEC)


@gluon.jit
def _staged_stats_kernel(
    logits_ptr, ids_ptr, mask_ptr, old_ptr, ref_ptr, m_ptr, s_ptr, count_ptr, ws_ptr,
    tokens, stride_b, stride_t, seq, vocab, scale2, inv_temp, inv_lo,
    CHUNK: gl.constexpr, BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr,
    VEC: gl.constexpr, THREAD_STATS: gl.constexpr, HAS_MASK: gl.constexpr, HAS_OLD: gl.constexpr,
    HAS_KL: gl.constexpr,
):
    """members._stats_kernel, staged: (max, ln S, logp) of every unmasked token; masked rows unread."""
    THREADS: gl.constexpr = 32 * gl.num_warps()
    REPS: gl.constexpr = BLOCK // (THREADS * VEC)
    NBLK: gl.constexpr = CHUNK // BLOCK
    layout: gl.constexpr = gl.BlockedLayout([REPS, 1, VEC], [1, 32, 1], [1, gl.num_warps(), 1], [2, 1, 0])
    stage = gl.allocate_shared_memory(logits_ptr.dtype.element_ty, [NBLK, REPS, THREADS, VEC],
                                      gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    pid = gl.program_id(0)
    token = pid // NUM_CHUNKS
    k = pid % NUM_CHUNKS
    b = token // seq
    t = token % seq
    start = k * CHUNK
    live = True
    if HAS_MASK:
        live = gl.load(mask_ptr + token) != 0
    if live:
        lanes = _block_offsets(REPS, THREADS, VEC, layout)
        row_ptr = logits_ptr + b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t
        if start + CHUNK > vocab:
            _copy_chunk(stage, row_ptr, start, vocab, lanes, NBLK, BLOCK, True)
            m, s = _chunk_stats(stage, start, vocab, scale2, lanes, layout, NBLK, BLOCK, THREADS, True, THREAD_STATS)
        else:
            _copy_chunk(stage, row_ptr, start, vocab, lanes, NBLK, BLOCK, False)
            m, s = _chunk_stats(stage, start, vocab, scale2, lanes, layout, NBLK, BLOCK, THREADS, False, THREAD_STATS)
        last = True
        if NUM_CHUNKS > 1:
            gl.store(m_ptr + token * NUM_CHUNKS + k, m)
            gl.store(s_ptr + token * NUM_CHUNKS + k, s)
            arrived = gl.atomic_add(count_ptr + token, 1, sem="acq_rel")
            last = arrived % NUM_CHUNKS == NUM_CHUNKS - 1  # counters never reset: members.py
        if last:
            if NUM_CHUNKS > 1:
                m, l2 = _combine2(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, scale2, NUM_CHUNKS,
                                  CHUNKS_P2)
            else:
                l2 = gl.log2(s)
            x_c = gl.load(row_ptr + gl.load(ids_ptr + token)).to(gl.float32)
            logp, lr, dref = _member_differences(x_c, m, l2, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD,
                                                 HAS_KL)
            gl.store(ws_ptr + token, m)
            gl.store(ws_ptr + tokens + token, l2 * LN2)
            gl.store(ws_ptr + 2 * tokens + token, logp)
            gl.store(ws_ptr + 5 * tokens + token, lr)
            gl.store(ws_ptr + 6 * tokens + token, dref)
