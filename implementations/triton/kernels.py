"""Row statistics shared by the member kernels (members.py): a row's (max, sum of exp) over a chunk
of the vocabulary, and the combination of its chunks' statistics.

Notation: a "row" is one logits position (b, t) over the vocabulary; a row is split into
NUM_CHUNKS chunks of CHUNK elements. m stays in the logits' units and ln S beside it: folding them
into one fp32 lse = m / T + ln S loses the row's scale once |logits| reach ~1e5 (the spec's
Student-t rows do): a 0.03 rounding of lse is a 3% error in every p of that row.

The first kernel generation (seed member only: the forward, fused, split and two-sweep kernels and
their launchers) lived here and in launch.py until issue 30; docs/triton-kernel-notes.md records what
each measured, and git keeps the code.
"""

import triton
import triton.language as tl


@triton.jit
def _combine(m_ptr, s_ptr, inv_temp, NUM_CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """A row's (max, ln S) from its chunks' (max, sum), read past L1 (other programs wrote them)."""
    k = tl.arange(0, CHUNKS_P2)
    km = k < NUM_CHUNKS
    ms = tl.load(m_ptr + k, mask=km, other=-float("inf"), volatile=True)
    ss = tl.load(s_ptr + k, mask=km, other=0.0, volatile=True)
    m = tl.max(ms, axis=0)
    return m, tl.log(tl.sum(ss * tl.exp((ms - m) * inv_temp), axis=0))


@triton.jit
def _block_update(m, s, x, inv_temp):
    """Online (max, sum of exp((x - max) / T)) over one more block: one exp per element."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    return m_new, s * tl.exp((m - m_new) * inv_temp) + tl.sum(tl.exp((x - m_new) * inv_temp), axis=0)


@triton.jit
def _chunk_stats(row_ptr, start, stop, vocab, inv_temp, BLOCK: tl.constexpr, NUM_STAGES: tl.constexpr,
                 HINTS: tl.constexpr, VECTOR: tl.constexpr):
    """(max of the logits, sum of exp((x - max) / T)) over [start, stop) of a row.

    VECTOR keeps one running (max, sum) per lane: no reduction, hence no barrier, inside the loop,
    and still one exp per element (the smaller of exp(z - m) and exp(m - z) is the one needed).
    Otherwise each block is reduced to a scalar (max, sum) as it comes.
    """
    if VECTOR:
        m_vec = tl.full([BLOCK], -float("inf"), tl.float32)
        s_vec = tl.zeros([BLOCK], tl.float32)
    else:
        m = tl.full([], -float("inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
    for v0 in tl.range(start, stop, BLOCK, num_stages=NUM_STAGES):
        offs = v0 + tl.arange(0, BLOCK)
        inside = (offs < stop) & (offs < vocab)
        if HINTS:
            x = tl.load(row_ptr + offs, mask=inside, other=-float("inf"), eviction_policy="evict_last")
        else:
            x = tl.load(row_ptr + offs, mask=inside, other=-float("inf"))
        z = x.to(tl.float32)
        if VECTOR:
            d = tl.where(z > -float("inf"), (z - m_vec) * inv_temp, -float("inf"))  # padding adds nothing
            e = tl.exp(-tl.abs(d))
            s_vec = tl.where(d > 0, s_vec * e + 1.0, s_vec + e)
            m_vec = tl.maximum(m_vec, z)
        else:
            m, s = _block_update(m, s, z, inv_temp)
    if VECTOR:
        m = tl.max(m_vec, axis=0)
        s = tl.sum(s_vec * tl.exp((m_vec - m) * inv_temp), axis=0)
    return m, s
