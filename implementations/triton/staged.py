"""The shared-memory staged gradient kernel (Gluon, NVIDIA sm_80+): each chunk of a row crosses DRAM once.

A row is split into NUM_CHUNKS chunks; program (row, k) copies chunk k straight from global to
shared memory with cp.async (every block of the chunk in flight at once), reduces it to
(max, sum of 2^(z - max)) block by block as the copies land, publishes that pair, waits for the
row's other chunks (the same atomic counter as kernels._split_kernel), and writes its part of the
gradient from shared memory. The second sweep never touches L2 or DRAM: the plain-Triton split
kernel's second sweep depends on L2 holding every row in flight, which it cannot promise.

Everything is computed in the base-2 domain (z2 = x * log2(e) / T), so each element costs one
exp2 per sweep. The one-hot term is applied by the target's program after its sweep (a CTA
barrier orders the two stores), so the sweep itself has no compare/select per element.

Gluon is Triton's lower-level dialect (explicit layouts and shared memory); it does not run under
TRITON_INTERPRET=1, so launch.py uses it only on CUDA and keeps the plain kernels for the rest.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _combine2(m_ptr, s_ptr, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr, layout: gl.constexpr):
    """log2-sum-exp2 of a row from its chunks' (max, sum), read past L1 (other programs wrote them)."""
    k = gl.arange(0, CHUNKS_P2, layout=layout)
    km = k < NUM_CHUNKS
    ms = gl.load(m_ptr + k, mask=km, other=-float("inf"), volatile=True)
    ss = gl.load(s_ptr + k, mask=km, other=0.0, volatile=True)
    m = gl.max(ms, axis=0)
    return m + gl.log2(gl.sum(ss * gl.exp2(ms - m), axis=0))


@gluon.jit
def _staged_kernel(
    logits_ptr, ids_ptr, adv_ptr, grad_ptr, m_ptr, s_ptr, count_ptr, token_loss_ptr, lse_ptr,
    stride_b, stride_t, seq, vocab, scale2, inv_temp, eps_low, eps_high, inv_bst,
    CHUNK: gl.constexpr, BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNKS_P2: gl.constexpr,
    VEC: gl.constexpr,
):
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0])
    small: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    NBLK: gl.constexpr = CHUNK // BLOCK
    stage = gl.allocate_shared_memory(logits_ptr.dtype.element_ty, [NBLK, BLOCK],
                                      gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pid = gl.program_id(0)
    row = pid // NUM_CHUNKS  # chunk index fastest: a row's programs are dispatched together
    k = pid % NUM_CHUNKS
    b = row // (seq + 1)
    t = row % (seq + 1)
    start = k * CHUNK
    lanes = gl.arange(0, BLOCK, layout=layout)
    grad_row = grad_ptr + row.to(gl.int64) * vocab
    if t == seq:
        for i in gl.static_range(NBLK):
            offs = start + i * BLOCK + lanes
            gl.store(grad_row + offs, gl.zeros([BLOCK], grad_ptr.dtype.element_ty, layout), mask=offs < vocab)
    else:
        token = b * seq + t
        row_ptr = logits_ptr + b.to(gl.int64) * stride_b + t.to(gl.int64) * stride_t
        for i in gl.static_range(NBLK):  # every copy of the chunk in flight at once
            offs = start + i * BLOCK + lanes
            async_copy.async_copy_global_to_shared(stage.index(i), row_ptr + offs, mask=offs < vocab)
            async_copy.commit_group()
        m = -float("inf")
        s = 0.0
        for i in gl.static_range(NBLK):
            async_copy.wait_group(NBLK - 1 - i)
            gl.thread_barrier()
            offs = start + i * BLOCK + lanes
            x = stage.index(i).load(layout)
            z = gl.where(offs < vocab, x.to(gl.float32) * scale2, -float("inf"))
            m_new = gl.maximum(m, gl.max(z, axis=0))
            s = s * gl.exp2(m - m_new) + gl.sum(gl.exp2(z - m_new), axis=0)
            m = m_new
        if NUM_CHUNKS > 1:
            gl.store(m_ptr + token * NUM_CHUNKS + k, m)
            gl.store(s_ptr + token * NUM_CHUNKS + k, s)
            gl.atomic_add(count_ptr + token, 1, sem="release")
            while gl.atomic_add(count_ptr + token, 0, sem="acquire") < NUM_CHUNKS:
                pass
            lse2 = _combine2(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, NUM_CHUNKS, CHUNKS_P2, small)
        else:
            lse2 = m + gl.log2(s)
        target = gl.load(ids_ptr + token)
        adv = gl.load(adv_ptr + b).to(gl.float32)
        x_c = gl.load(row_ptr + target).to(gl.float32)
        logp = x_c * inv_temp - lse2 * LN2
        ratio = gl.exp(logp - logp)  # the importance ratio with old = logp.detach(): exactly 1
        clipped = gl.minimum(gl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
        coef = gl.where(clipped * adv >= ratio * adv, adv * ratio, 0.0) * inv_bst
        if k == 0:
            gl.store(token_loss_ptr + token, -gl.minimum(ratio * adv, clipped * adv))
            gl.store(lse_ptr + token, lse2 * LN2)
        for i in gl.static_range(NBLK):
            offs = start + i * BLOCK + lanes
            x = stage.index(i).load(layout)
            g = coef * gl.exp2(x.to(gl.float32) * scale2 - lse2)
            gl.store(grad_row + offs, g.to(grad_ptr.dtype.element_ty), mask=offs < vocab, cache_modifier=".cs")
        if (target >= start) & (target < start + CHUNK):
            gl.thread_barrier()  # orders the sweep's store of this element before the one-hot fix
            gl.store(grad_row + target, (coef * (gl.exp2(x_c * scale2 - lse2) - 1.0)).to(grad_ptr.dtype.element_ty))
