"""The forward-only call's statistics sweep, staged in shared memory (Gluon, NVIDIA sm_80+; CUDA only: Gluon
does not run under TRITON_INTERPRET=1). Imported only by sweep.py, and only on CUDA.

_staged_row_stats_kernel: program (row, k) copies chunk k of one logits row straight from global to shared
memory with cp.async (every block of the chunk in flight at once: ~32 KB a program, what the H200 needs in
flight to read at its copy rate), reduces it to (max, sum of 2^((x - max) * scale2)) as the copies land, and
publishes the pair; the row's last chunk to arrive (an acq_rel arrival counter; nobody waits) combines them
and stores the row's max and ln S. The plain per-row sweeps (kernels.py) keep at most ~4 KB in flight a
program and reduce between loads: 0.19 ms against 0.12 ms for the same 0.53 GB at b2 (docs/fused-kernel.md).
Masked rows are never read. Rows must start on 16-byte boundaries (sweep.py checks; else the plain sweep).

The helpers below are exact copies of implementations/triton/staged_chunks.py's (an implementation folder
runs alone in the worker: vendored.py says why); tests/test_triton_fused.py fails when a copy and its
original differ.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

PAD = gl.constexpr(-1.0e30)  # finite padding: a thread whose elements are all padding keeps s * 2^(PAD - m) = 0
LN2 = gl.constexpr(0.6931471805599453)


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
def _staged_row_stats_kernel(x_ptr, mask_ptr, st_ptr, m_ptr, s_ptr, count_ptr, row0, stride_x, stride_st, vocab, scale2,
                             CHUNK: gl.constexpr, BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr,
                             CHUNKS_P2: gl.constexpr, VEC: gl.constexpr, THREAD_STATS: gl.constexpr,
                             HAS_MASK: gl.constexpr):
    """st[r] = max and st[stride_st + r] = ln S (sum of exp((x - max) / T)) of row r of the chunk (token row0 + r).
    m_ptr / s_ptr: [rows, NUM_CHUNKS] partials; count_ptr: [rows] arrival counters, zeroed once and never
    reset (the last arrival is the one whose count is NUM_CHUNKS - 1 modulo NUM_CHUNKS)."""
    THREADS: gl.constexpr = 32 * gl.num_warps()
    REPS: gl.constexpr = BLOCK // (THREADS * VEC)
    NBLK: gl.constexpr = CHUNK // BLOCK
    layout: gl.constexpr = gl.BlockedLayout([REPS, 1, VEC], [1, 32, 1], [1, gl.num_warps(), 1], [2, 1, 0])
    stage = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NBLK, REPS, THREADS, VEC],
                                      gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    pid = gl.program_id(0)
    r = pid // NUM_CHUNKS
    k = pid % NUM_CHUNKS
    start = k * CHUNK
    live = True
    if HAS_MASK:
        live = gl.load(mask_ptr + row0 + r) != 0
    if live:
        lanes = _block_offsets(REPS, THREADS, VEC, layout)
        # rows start on 16-byte boundaries and V is a multiple of VEC (sweep.why_not), written so that the compiler
        # sees it (`// VEC * VEC`: the JIT's own hint covers only multiples of 16, and cp.async refuses pieces it
        # cannot prove whole; gl.multiple_of on these scalars did not reach the copy's mask, triton 3.6 and 3.9)
        row_ptr = x_ptr + r.to(gl.int64) * (stride_x // VEC) * VEC
        limit = vocab // VEC * VEC
        if start + CHUNK > limit:
            _copy_chunk(stage, row_ptr, start, limit, lanes, NBLK, BLOCK, True)
            m, s = _chunk_stats(stage, start, limit, scale2, lanes, layout, NBLK, BLOCK, THREADS, True, THREAD_STATS)
        else:
            _copy_chunk(stage, row_ptr, start, limit, lanes, NBLK, BLOCK, False)
            m, s = _chunk_stats(stage, start, limit, scale2, lanes, layout, NBLK, BLOCK, THREADS, False, THREAD_STATS)
        last = True
        if NUM_CHUNKS > 1:
            gl.store(m_ptr + r * NUM_CHUNKS + k, m)
            gl.store(s_ptr + r * NUM_CHUNKS + k, s)
            arrived = gl.atomic_add(count_ptr + r, 1, sem="acq_rel")
            last = arrived % NUM_CHUNKS == NUM_CHUNKS - 1
        if last:
            if NUM_CHUNKS > 1:
                m, l2 = _combine2(m_ptr + r * NUM_CHUNKS, s_ptr + r * NUM_CHUNKS, scale2, NUM_CHUNKS, CHUNKS_P2)
            else:
                l2 = gl.log2(s)
            gl.store(st_ptr + r, m)
            gl.store(st_ptr + stride_st + r, l2 * LN2)
