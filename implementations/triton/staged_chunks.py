"""One chunk's journey in the staged (Gluon) kernels of staged.py: its offsets, the cp.async copy into
shared memory, its (max, sum) reduced as the copies land, the two-float combine of a row's chunks and
the gradient written back from shared memory (staged.py's docstring says why each step is shaped so).
Every helper takes a row pointer and a `vocab` bound: staged.py passes the row itself for aligned rows
and its aligned body (staged_rows.py) for the others, so one copy of each step serves both."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

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
def _zero_chunk(grad_row, start, vocab, lanes, layout: gl.constexpr, NBLK: gl.constexpr, BLOCK: gl.constexpr,
                REPS: gl.constexpr, THREADS: gl.constexpr, VEC: gl.constexpr):
    for i in gl.static_range(NBLK):
        offs = start + i * BLOCK + lanes
        gl.store(grad_row + offs, gl.zeros([REPS, THREADS, VEC], grad_row.dtype.element_ty, layout), mask=offs < vocab)
