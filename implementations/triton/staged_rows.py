"""Rows that do not start on a 16-byte boundary, for the staged (Gluon) kernels of staged.py (HEAD=True).

cp.async moves 16-byte pieces from 16-byte aligned addresses. With a vocabulary that is not a multiple
of 16 bytes (GPT-2's 50257: rows of 100,514 bytes in bf16), row r of a contiguous tensor starts
r * V elements past an aligned base, so its alignment changes from row to row; the aligned kernels
cannot stage it, and the plain kernels that ran there instead reached 2.8x the DRAM floor on the H200
(docs/triton-kernel-notes.md, "The sweep on the H200"). Each row is cut in three:

- head: elements [0, h), h = (-offset) mod VEC, up to the row's first 16-byte boundary (VEC elements
  of 16 bytes: 8 in bf16/fp16, 4 in fp32);
- body: [h, h + body), body = (V - h) rounded down to whole VECs: the row's aligned middle. The
  kernels stage it exactly as an aligned row (chunks of CHUNK elements counted from h, the last one
  masked at `body`), from an offset the compiler is told is a multiple of VEC (gl.multiple_of), so
  every cp.async and gradient store stays a 16-byte vector;
- tail: [h + body, V), fewer than VEC elements.

Head and tail (at most 2 VEC - 2 elements) are the row's "extras": chunk 0's program loads them with
plain masked loads, folds them into its (max, sum) before publishing it, keeps them in registers over
the wait and writes their gradient after its sweep. The other programs run the same code with every
lane masked off (no branch, nothing loaded).

The gradient is written through the same split, so the logits' offset of a row and its gradient's
must agree modulo VEC: plan.py takes this path only then (launch.staged_rows), and only for V >= 16
(so V - h > 0 and the integer arithmetic below stays non-negative, where Triton's truncating division
and Python's flooring one agree: tests run `_row_split.fn` on Python integers as the kernel's own
arithmetic).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

PAD = gl.constexpr(-1.0e30)  # staged.py's padding: 2^((PAD - m) * scale2) is 0 next to any real logit


@gluon.jit
def _row_split(offset, vocab, VEC: gl.constexpr):
    """(h, body) of a row starting `offset` elements past a 16-byte aligned base (module docstring)."""
    h = (VEC - offset % VEC) % VEC
    body = (vocab - h) // VEC * VEC
    return h, body


@gluon.jit
def _extra_offsets(h, body, vocab, mine, VEC: gl.constexpr, layout: gl.constexpr):
    """Row offsets of the head (lanes 0..VEC-1) and tail (lanes VEC..2 VEC-1), and which of them exist
    and belong to this program (`mine`: chunk 0)."""
    j = gl.arange(0, 2 * VEC, layout=layout)
    idx = gl.where(j < VEC, j, h + body + j - VEC)
    valid = ((j < VEC) & (j < h) | (j >= VEC) & (idx < vocab)) & mine
    return idx, valid


@gluon.jit
def _fold_extras(row_ptr, idx, valid, m, s, scale2):
    """The extras' logits (fp32, PAD where absent) and the chunk's (max, sum) with them folded in."""
    x = gl.load(row_ptr + idx, mask=valid, other=0.0).to(gl.float32)
    x = gl.where(valid, x, PAD)  # not `other=PAD`: -1e30 is -inf in fp16, and inf - inf is NaN
    m_new = gl.maximum(m, gl.max(x, axis=0))
    e = gl.where(valid, gl.exp2((x - m_new) * scale2), 0.0)
    return x, m_new, s * gl.exp2((m - m_new) * scale2) + gl.sum(e, axis=0)


@gluon.jit
def _write_extras(grad_row, idx, valid, x, scale2, m, l2, coef):
    g = (coef * gl.exp2((x - m) * scale2 - l2)).to(grad_row.dtype.element_ty)
    gl.store(grad_row + idx, g, mask=valid)


@gluon.jit
def _zero_extras(grad_row, idx, valid, VEC: gl.constexpr, layout: gl.constexpr):
    gl.store(grad_row + idx, gl.zeros([2 * VEC], grad_row.dtype.element_ty, layout), mask=valid)
