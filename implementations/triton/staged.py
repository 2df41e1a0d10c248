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

HEAD (a constexpr, off for aligned rows, whose compiled code it leaves untouched): rows that start
off 16-byte boundaries (V = 50257) are staged from their first boundary on and chunk 0 takes the few
elements before it and after the last one (staged_rows.py). The chunk steps live in staged_chunks.py,
the per-token terms in staged_terms.py.

Gluon is Triton's lower-level dialect (explicit layouts and shared memory); it does not run under
TRITON_INTERPRET=1, so plan.py uses it only on CUDA and keeps the plain kernels (members.py) for the rest.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .staged_chunks import _block_offsets, _chunk_stats, _combine2, _copy_chunk, _write_grad, _zero_chunk
from .staged_rows import _extra_offsets, _fold_extras, _row_split, _write_extras, _zero_extras
from .staged_terms import _member_differences, _member_terms

LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _staged_member_kernel(
    logits_ptr, ids_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, wb_ptr, rb_ptr, grad_ptr, m_ptr, s_ptr,
    count_ptr, ws_ptr, flag_ptr, tokens, stride_b, stride_t, seq, vocab, scale2, inv_temp, inv_lo, eps_low, eps_high, delta,
    beta, cap, w_const,
    CHUNK: gl.constexpr, BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr,
    VEC: gl.constexpr, THREAD_STATS: gl.constexpr, HAS_OLD: gl.constexpr, HAS_KL: gl.constexpr,
    HAS_MASK: gl.constexpr, HAS_RHO: gl.constexpr, HAS_DELTA: gl.constexpr, HAS_CAP: gl.constexpr,
    CISPO: gl.constexpr, KL_BC: gl.constexpr, RHO_MASK: gl.constexpr, SEQ_RHO: gl.constexpr, SAPO: gl.constexpr,
    PER_SEQ_W: gl.constexpr, IN_BACKWARD: gl.constexpr, INTERLEAVE: gl.constexpr, HEAD: gl.constexpr,
):
    """members._main_kernel, staged: mode 0 writes c_pred times the gradient, 1 only the statistics
    and terms; IN_BACKWARD (flag_ptr is d loss) always writes the gradient and leaves ws alone.
    INTERLEAVE: consecutive rows of the grid are the same position of successive sequences, so that
    right-padded (masked, write-only) rows run beside unmasked (read + write) ones instead of in
    write-only stretches at the end of each sequence. HEAD: rows need not start on a 16-byte boundary
    (staged_rows.py: a row's aligned body is staged, chunk 0 takes its head and tail); the logits' and
    the gradient's offsets of a row agree modulo VEC (launch.staged_rows)."""
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
    if HEAD:  # chunks count from the row's first 16-byte boundary h and stop at its last one (h + body)
        h, body = _row_split(row.to(gl.int64) * vocab, vocab, VEC)
        h = h.to(gl.int32)
        limit = gl.multiple_of(body.to(gl.int32), VEC)
        grad_body = grad_ptr + gl.multiple_of(row.to(gl.int64) * vocab + h, VEC)
        small: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        eidx, evalid = _extra_offsets(h, limit, vocab, k == 0, VEC, small)
    else:
        limit = vocab
        grad_body = grad_row
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
            _zero_chunk(grad_body, start, limit, lanes, layout, NBLK, BLOCK, REPS, THREADS, VEC)
            if HEAD:
                _zero_extras(grad_row, eidx, evalid, VEC, small)
    else:
        token = b * seq + t
        if HAS_MASK:
            live = gl.load(mask_ptr + token) != 0
        else:
            live: gl.constexpr = True
        if live:
            row_ptr = logits_ptr + b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t
            if HEAD:
                body_ptr = logits_ptr + gl.multiple_of(b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t + h, VEC)
            else:
                body_ptr = row_ptr
            tail = start + CHUNK > limit
            if tail:
                _copy_chunk(stage, body_ptr, start, limit, lanes, NBLK, BLOCK, True)
                m, s = _chunk_stats(stage, start, limit, scale2, lanes, layout, NBLK, BLOCK, THREADS, True,
                                    THREAD_STATS)
            else:
                _copy_chunk(stage, body_ptr, start, limit, lanes, NBLK, BLOCK, False)
                m, s = _chunk_stats(stage, start, limit, scale2, lanes, layout, NBLK, BLOCK, THREADS, False,
                                    THREAD_STATS)
            if HEAD:  # chunk 0 owns the head and tail: in its pair before anyone combines (staged_rows.py)
                xe, m, s = _fold_extras(row_ptr, eidx, evalid, m, s, scale2)
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
                        _write_grad(stage, grad_body, start, limit, scale2, m, l2, coef_g, lanes, layout, NBLK, BLOCK,
                                    True)
                    else:
                        _write_grad(stage, grad_body, start, limit, scale2, m, l2, coef_g, lanes, layout, NBLK, BLOCK,
                                    False)
                    if HEAD:  # the target's element is chunk 0's when it lies in the head or tail
                        _write_extras(grad_row, eidx, evalid, xe, scale2, m, l2, coef_g)
                        rel = target - h
                        outside = (rel < 0) | (rel >= limit)
                        mine = ((rel >= start) & (rel < start + CHUNK) & ~outside) | (outside & (k == 0))
                    else:
                        mine = (target >= start) & (target < start + CHUNK)
                    if mine:
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
                _zero_chunk(grad_body, start, limit, lanes, layout, NBLK, BLOCK, REPS, THREADS, VEC)
                if HEAD:
                    _zero_extras(grad_row, eidx, evalid, VEC, small)


@gluon.jit
def _staged_stats_kernel(
    logits_ptr, ids_ptr, mask_ptr, old_ptr, ref_ptr, m_ptr, s_ptr, count_ptr, ws_ptr,
    tokens, stride_b, stride_t, seq, vocab, scale2, inv_temp, inv_lo,
    CHUNK: gl.constexpr, BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr,
    VEC: gl.constexpr, THREAD_STATS: gl.constexpr, HAS_MASK: gl.constexpr, HAS_OLD: gl.constexpr,
    HAS_KL: gl.constexpr, HEAD: gl.constexpr,
):
    """members._stats_kernel, staged: (max, ln S, logp) of every unmasked token; masked rows unread.
    HEAD: rows need not start on a 16-byte boundary (staged_rows.py)."""
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
        if HEAD:  # as in _staged_member_kernel; only the logits are read here
            h, body = _row_split(b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t, vocab, VEC)
            h = h.to(gl.int32)
            limit = gl.multiple_of(body.to(gl.int32), VEC)
            body_ptr = logits_ptr + gl.multiple_of(b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t + h, VEC)
        else:
            limit = vocab
            body_ptr = row_ptr
        if start + CHUNK > limit:
            _copy_chunk(stage, body_ptr, start, limit, lanes, NBLK, BLOCK, True)
            m, s = _chunk_stats(stage, start, limit, scale2, lanes, layout, NBLK, BLOCK, THREADS, True, THREAD_STATS)
        else:
            _copy_chunk(stage, body_ptr, start, limit, lanes, NBLK, BLOCK, False)
            m, s = _chunk_stats(stage, start, limit, scale2, lanes, layout, NBLK, BLOCK, THREADS, False, THREAD_STATS)
        if HEAD:
            small: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
            eidx, evalid = _extra_offsets(h, limit, vocab, k == 0, VEC, small)
            _xe, m, s = _fold_extras(row_ptr, eidx, evalid, m, s, scale2)
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
