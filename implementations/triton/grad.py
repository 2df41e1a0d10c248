"""The backward's plain kernel (`_grad_kernel`, moved here from members.py, whose docstring describes
`ws` and the flag): the gradient from the saved row statistics, d loss read on the device, one read of
the logits and one write of the gradient per work item (a row's chunk of CHUNK elements), on a grid of
persistent programs (plan.Tuning: grad_*). Sequence-level members (GSPO, VESPO) always come here; token-
level ones when the forward's prediction of d loss missed.

HEAD (rows off 16-byte boundaries, e.g. V 50257: plan.Plan.grad_head): the staged kernels' split
(staged_rows.py) in plain Triton. A row's chunks are counted from its first 16-byte boundary h and masked
at its last one (h + body), from offsets the compiler is told are multiples of VEC (tl.multiple_of), so
the chunk's loads and stores can be 16 bytes wide; the row's first work item also writes the head [0, h)
and tail [h + body, V), at most 2 VEC - 2 elements, with a small masked load and store. Without it every
access of such a row is one element wide (nothing proves more). Every element's value is computed as
without HEAD (the split only regroups elements), so both give the same bits, and the interpreter runs it.
"""

import triton
import triton.language as tl


@triton.jit
def _row_split(offset, vocab, VEC: tl.constexpr):
    """(h, body) of a row `offset` elements past a 16-byte aligned base: staged_rows._row_split's twin
    (a Gluon function cannot be called from a Triton one; tests check the two agree)."""
    h = (VEC - offset % VEC) % VEC
    body = (vocab - h) // VEC * VEC
    return h, body


@triton.jit
def _grad_piece(x_ptrs, g_ptrs, pos, mask, target, m, log_s, coef, inv_temp, HINTS: tl.constexpr):
    """coef * (softmax - onehot) at row positions `pos`: the same arithmetic as the aligned path."""
    if HINTS:
        x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        x = tl.load(x_ptrs, mask=mask, other=0.0)
    p = tl.exp((x.to(tl.float32) - m) * inv_temp - log_s)
    g = coef * (p - tl.where(pos == target, 1.0, 0.0))
    tl.store(g_ptrs, g.to(g_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _head_item(logits_ptr, ids_ptr, grad_ptr, ws_ptr, row, b, t, k, token, tokens, coef, stride_b, stride_t,
               vocab, inv_temp, CHUNK: tl.constexpr, HINTS: tl.constexpr, VEC: tl.constexpr):
    """One work item of a HEAD row: body chunk k, and for k = 0 the head and tail too (module docstring).
    The logits' and the gradient's offsets of a row agree modulo VEC (launch.row_layout)."""
    x_off = tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
    g_off = tl.cast(row, tl.int64) * vocab
    h, body = _row_split(g_off, vocab, VEC)
    h = h.to(tl.int32)
    body = tl.multiple_of(body.to(tl.int32), VEC)
    rel = k * CHUNK + tl.arange(0, CHUNK)
    in_body = rel < body
    x_body = logits_ptr + tl.multiple_of(x_off + h, VEC)
    g_body = grad_ptr + tl.multiple_of(g_off + h, VEC)
    j = tl.arange(0, 2 * VEC)
    idx = tl.where(j < VEC, j, h + body + j - VEC)
    mine = j < tl.where(k == 0, 2 * VEC, 0)  # chunk 0's (a scalar & tensor mask trips the interpreter)
    extra = ((j < VEC) & (j < h) | (j >= VEC) & (idx < vocab)) & mine
    if coef != 0.0:  # masked, clipped and last rows: zeros, logits unread
        m = tl.load(ws_ptr + token)
        log_s = tl.load(ws_ptr + tokens + token)
        target = tl.load(ids_ptr + token)
        _grad_piece(x_body + rel, g_body + rel, h + rel, in_body, target, m, log_s, coef, inv_temp, HINTS)
        _grad_piece(logits_ptr + x_off + idx, grad_ptr + g_off + idx, idx, extra, target, m, log_s, coef, inv_temp,
                    HINTS)
    else:
        tl.store(g_body + rel, tl.zeros([CHUNK], dtype=grad_ptr.dtype.element_ty), mask=in_body)
        tl.store(grad_ptr + g_off + idx, tl.zeros([2 * VEC], dtype=grad_ptr.dtype.element_ty), mask=extra)


@triton.jit
def _grad_kernel(logits_ptr, ids_ptr, grad_ptr, ws_ptr, flag_ptr, dloss_ptr, tokens, n_items,
                 stride_b, stride_t, seq, vocab, inv_temp,
                 CHUNK: tl.constexpr, NUM_CHUNKS: tl.constexpr, FORCE_STATS: tl.constexpr,
                 UPDATE_FLAG: tl.constexpr, HINTS: tl.constexpr, HEAD: tl.constexpr, VEC: tl.constexpr):
    """See the module docstring. HEAD: rows need not start on a 16-byte boundary (_head_item)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    c = tl.load(dloss_ptr).to(tl.float32)
    if UPDATE_FLAG:
        if pid == 0:  # what the next forward of this plan should expect: mode 0 predicting c if c repeats
            tl.store(flag_ptr, tl.where(c == tl.load(flag_ptr + 1), 0.0, 1.0))
            tl.store(flag_ptr + 1, c)
    if FORCE_STATS:
        from_stats = True
    else:
        # A forward that predicted another d loss wrote a rounded gradient; rescaling it would round
        # twice (up to two steps of the logits dtype: the validator's upstream-gradient check saw
        # 1.2% in bf16). A mispredicted call recomputes from the statistics instead: one more pass
        # on that call, exact to one rounding on every call.
        from_stats = (tl.load(ws_ptr + 7 * tokens) > 0.5) | (c != tl.load(ws_ptr + 7 * tokens + 1))
    if from_stats:
        for item in range(pid, n_items, step):
            row = item // NUM_CHUNKS
            k = item % NUM_CHUNKS
            b = row // (seq + 1)
            t = row % (seq + 1)
            token = b * seq + t
            scored = t < seq
            if HEAD:
                coef = tl.load(ws_ptr + 3 * tokens + token, mask=scored, other=0.0) * c
                _head_item(logits_ptr, ids_ptr, grad_ptr, ws_ptr, row, b, t, k, token, tokens, coef, stride_b,
                           stride_t, vocab, inv_temp, CHUNK, HINTS, VEC)
            else:
                offs = k * CHUNK + tl.arange(0, CHUNK)
                inside = offs < vocab
                grad_row = grad_ptr + tl.cast(row, tl.int64) * vocab
                coef = tl.load(ws_ptr + 3 * tokens + token, mask=scored, other=0.0) * c
                if coef != 0.0:  # masked, clipped and last rows: zeros, logits unread
                    row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
                    m = tl.load(ws_ptr + token)
                    log_s = tl.load(ws_ptr + tokens + token)
                    target = tl.load(ids_ptr + token)
                    if HINTS:
                        x = tl.load(row_ptr + offs, mask=inside, other=0.0, eviction_policy="evict_first")
                    else:
                        x = tl.load(row_ptr + offs, mask=inside, other=0.0)
                    p = tl.exp((x.to(tl.float32) - m) * inv_temp - log_s)
                    g = coef * (p - tl.where(offs == target, 1.0, 0.0))
                    tl.store(grad_row + offs, g.to(grad_ptr.dtype.element_ty), mask=inside)
                else:
                    tl.store(grad_row + offs, tl.zeros([CHUNK], dtype=grad_ptr.dtype.element_ty), mask=inside)
    else:
        pass  # d loss = 1 on the forward's gradient: nothing to do
