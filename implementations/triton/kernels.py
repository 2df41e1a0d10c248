"""Triton kernels for spec grpo-token-is (token-level GRPO, no old log-probs, no KL, no mask).

Notation: a "row" is one logits position (b, t) over the vocabulary, flattened as
row = b * (S + 1) + t; rows with t == S are never read and get an exact zero gradient. A row is
split into NUM_CHUNKS chunks of CHUNK elements; program (row, k) owns chunk k.

  p_v   = exp((z_v - m) / T - ln S)                   (softmax, fp32; m = max_v z_v, S = sum_v exp((z_v - m) / T))
  logp  = (x_c - m) / T - ln S ;  r = exp(logp - logp) = 1   (old = logp.detach())

m stays in the logits' units and ln S beside it: folding them into one fp32 lse = m / T + ln S
loses the row's scale once |logits| reach ~1e5 (the spec's Student-t rows do): a 0.03 rounding of
lse is a 3% error in every p of that row.
  loss_t = -min(r*A, clip(r, 1-eps_lo, 1+eps_hi)*A)
  dL/dz_v = coef * (p_v - onehot_v),  coef = A*r*[unclipped branch active] / (B*S*T)

Kernels (launch.py picks one per call; docs/triton-kernel-notes.md says what each measured):
  _forward_kernel   no gradient work (torch.no_grad): chunk statistics, the last program of a
                    row to finish (counted with an atomic) combines them and writes the token loss.
  _fused_kernel     gradient in the same pass as the loss: each program keeps its chunk (as
                    exp(z - m)) in registers, publishes its (max, sum), waits for the row's other
                    chunks (SYNC), then writes its part of the gradient from registers.
  _split_kernel     the same split and wait, but each program sweeps its chunk twice in blocks
                    (the second sweep served from L2: a row is spread over several SMs, so what
                    is in flight stays small), keeping registers free for more programs.
  _two_sweep_kernel one program per row (or a persistent grid): a max/sum sweep, then a gradient
                    sweep; eviction hints keep the row in L2 between them.
Waiting kernels need every program of a row resident at once; with one chunk per row they never
wait, which is how they run under TRITON_INTERPRET=1 (programs run one after another there).
  _finalize_kernel  the reduction of token losses to the scalar loss (one program, deterministic).
  _scale_kernel     backward: multiplies the saved gradient by d loss; exits at once when it is 1.
  _grad_from_stats_kernel  a second backward: the gradient again from the saved (max, ln S).
"""

import triton
import triton.language as tl


@triton.jit
def _token_terms(logp, adv, eps_low, eps_high, inv_bst):
    """Per-token loss and gradient coefficient of the clipped surrogate at ratio exp(logp - logp)."""
    ratio = tl.exp(logp - logp)
    clipped = tl.minimum(tl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
    loss = -tl.minimum(ratio * adv, clipped * adv)
    active = clipped * adv >= ratio * adv
    coef = tl.where(active, adv * ratio, 0.0) * inv_bst
    return loss, coef


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


@triton.jit
def _chunk_grad(row_ptr, grad_row, start, stop, vocab, inv_temp, m, log_s, coef, target, BLOCK: tl.constexpr,
                NUM_STAGES: tl.constexpr, HINTS: tl.constexpr):
    for v0 in tl.range(start, stop, BLOCK, num_stages=NUM_STAGES):
        offs = v0 + tl.arange(0, BLOCK)
        inside = (offs < stop) & (offs < vocab)
        if HINTS:
            x = tl.load(row_ptr + offs, mask=inside, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(row_ptr + offs, mask=inside, other=0.0)
        g = coef * (tl.exp((x.to(tl.float32) - m) * inv_temp - log_s) - tl.where(offs == target, 1.0, 0.0))
        if HINTS:
            tl.store(grad_row + offs, g.to(grad_row.dtype.element_ty), mask=inside, cache_modifier=".cs")
        else:
            tl.store(grad_row + offs, g.to(grad_row.dtype.element_ty), mask=inside)


@triton.jit
def _forward_kernel(
    logits_ptr, ids_ptr, adv_ptr, m_ptr, s_ptr, count_ptr, token_loss_ptr,
    stride_b, stride_t, seq, vocab, inv_temp, eps_low, eps_high,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    NUM_STAGES: tl.constexpr, VECTOR: tl.constexpr,
):
    # One flat grid, chunk index fastest, so a row's programs are launched together.
    pid = tl.program_id(0)
    token = pid // NUM_CHUNKS  # b * seq + t, t < seq: the last position is never read
    k = pid % NUM_CHUNKS
    b = token // seq
    t = token % seq
    row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
    m, s = _chunk_stats(row_ptr, k * CHUNK, k * CHUNK + CHUNK, vocab, inv_temp, BLOCK, NUM_STAGES, False, VECTOR)
    last = True
    if NUM_CHUNKS > 1:
        tl.store(m_ptr + token * NUM_CHUNKS + k, m)
        tl.store(s_ptr + token * NUM_CHUNKS + k, s)
        # The last chunk program of this token to arrive combines; nobody waits.
        last = tl.atomic_add(count_ptr + token, 1, sem="acq_rel") == NUM_CHUNKS - 1
    if last:
        if NUM_CHUNKS > 1:
            m, log_s = _combine(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, inv_temp, NUM_CHUNKS,
                                CHUNKS_P2)
        else:
            log_s = tl.log(s)
        target = tl.load(ids_ptr + token)
        x_c = tl.load(row_ptr + target).to(tl.float32)
        adv = tl.load(adv_ptr + b).to(tl.float32)
        loss, _ = _token_terms((x_c - m) * inv_temp - log_s, adv, eps_low, eps_high, 0.0)
        tl.store(token_loss_ptr + token, loss)


@triton.jit
def _fused_kernel(
    logits_ptr, ids_ptr, adv_ptr, grad_ptr, m_ptr, s_ptr, count_ptr, token_loss_ptr, row_m_ptr, row_logs_ptr,
    stride_b, stride_t, seq, vocab, inv_temp, eps_low, eps_high, inv_bst,
    CHUNK: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, SYNC: tl.constexpr,
    STREAM_STORES: tl.constexpr,
):
    # Chunk index fastest: the programs of a row are dispatched together, so waiting for each
    # other cannot deadlock (earlier rows always finish and free their slots).
    pid = tl.program_id(0)
    row = pid // NUM_CHUNKS  # b * (seq + 1) + t over every position, the last one included
    k = pid % NUM_CHUNKS
    b = row // (seq + 1)
    t = row % (seq + 1)
    offs = k * CHUNK + tl.arange(0, CHUNK)
    inside = offs < vocab
    grad_row = grad_ptr + tl.cast(row, tl.int64) * vocab
    if t == seq:
        tl.store(grad_row + offs, tl.zeros([CHUNK], dtype=grad_ptr.dtype.element_ty), mask=inside)
    else:
        token = b * seq + t
        row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
        z = tl.load(row_ptr + offs, mask=inside, other=-float("inf")).to(tl.float32)
        m_k = tl.max(z, axis=0)
        e = tl.exp((z - m_k) * inv_temp)  # kept: the gradient reuses it, one exp per element in all
        s = tl.sum(e, axis=0)
        m = m_k
        if SYNC:
            tl.store(m_ptr + token * NUM_CHUNKS + k, m)
            tl.store(s_ptr + token * NUM_CHUNKS + k, s)
            tl.atomic_add(count_ptr + token, 1, sem="release")
            while tl.atomic_add(count_ptr + token, 0, sem="acquire") < NUM_CHUNKS:
                pass
            m, log_s = _combine(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, inv_temp, NUM_CHUNKS,
                                CHUNKS_P2)
        else:
            log_s = tl.log(s)
        target = tl.load(ids_ptr + token)
        adv = tl.load(adv_ptr + b).to(tl.float32)
        x_c = tl.load(row_ptr + target).to(tl.float32)
        loss, coef = _token_terms((x_c - m) * inv_temp - log_s, adv, eps_low, eps_high, inv_bst)
        if k == 0:
            tl.store(token_loss_ptr + token, loss)
            tl.store(row_m_ptr + token, m)
            tl.store(row_logs_ptr + token, log_s)
        g = coef * (e * tl.exp((m_k - m) * inv_temp - log_s) - tl.where(offs == target, 1.0, 0.0))
        g = g.to(grad_ptr.dtype.element_ty)
        if STREAM_STORES:
            tl.store(grad_row + offs, g, mask=inside, cache_modifier=".cs")
        else:
            tl.store(grad_row + offs, g, mask=inside)


@triton.jit
def _split_kernel(
    logits_ptr, ids_ptr, adv_ptr, grad_ptr, m_ptr, s_ptr, count_ptr, token_loss_ptr, row_m_ptr, row_logs_ptr,
    stride_b, stride_t, seq, vocab, inv_temp, eps_low, eps_high, inv_bst,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    NUM_STAGES: tl.constexpr, HINTS: tl.constexpr, VECTOR: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // NUM_CHUNKS  # chunk index fastest: a row's programs are dispatched together
    k = pid % NUM_CHUNKS
    b = row // (seq + 1)
    t = row % (seq + 1)
    grad_row = grad_ptr + tl.cast(row, tl.int64) * vocab
    start = k * CHUNK
    if t == seq:
        for v0 in range(start, start + CHUNK, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            tl.store(grad_row + offs, tl.zeros([BLOCK], dtype=grad_ptr.dtype.element_ty), mask=offs < vocab)
    else:
        token = b * seq + t
        row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
        m, s = _chunk_stats(row_ptr, start, start + CHUNK, vocab, inv_temp, BLOCK, NUM_STAGES, HINTS, VECTOR)
        if NUM_CHUNKS > 1:
            tl.store(m_ptr + token * NUM_CHUNKS + k, m)
            tl.store(s_ptr + token * NUM_CHUNKS + k, s)
            tl.atomic_add(count_ptr + token, 1, sem="release")
            while tl.atomic_add(count_ptr + token, 0, sem="acquire") < NUM_CHUNKS:
                pass
            m, log_s = _combine(m_ptr + token * NUM_CHUNKS, s_ptr + token * NUM_CHUNKS, inv_temp, NUM_CHUNKS,
                                CHUNKS_P2)
        else:
            log_s = tl.log(s)
        target = tl.load(ids_ptr + token)
        adv = tl.load(adv_ptr + b).to(tl.float32)
        x_c = tl.load(row_ptr + target).to(tl.float32)
        loss, coef = _token_terms((x_c - m) * inv_temp - log_s, adv, eps_low, eps_high, inv_bst)
        if k == 0:
            tl.store(token_loss_ptr + token, loss)
            tl.store(row_m_ptr + token, m)
            tl.store(row_logs_ptr + token, log_s)
        _chunk_grad(row_ptr, grad_row, start, start + CHUNK, vocab, inv_temp, m, log_s, coef, target, BLOCK,
                    NUM_STAGES, HINTS)


@triton.jit
def _two_sweep_kernel(
    logits_ptr, ids_ptr, adv_ptr, grad_ptr, token_loss_ptr, row_m_ptr, row_logs_ptr,
    stride_b, stride_t, seq, vocab, n_rows, inv_temp, eps_low, eps_high, inv_bst,
    BLOCK: tl.constexpr, PERSISTENT: tl.constexpr, HINTS: tl.constexpr, NUM_STAGES: tl.constexpr,
    VECTOR: tl.constexpr,
):
    """One program per row (PERSISTENT: a fixed grid strides over rows)."""
    start = tl.program_id(0)
    if PERSISTENT:
        step = tl.num_programs(0)
    else:
        step = n_rows
    for row in range(start, n_rows, step):
        b = row // (seq + 1)
        t = row % (seq + 1)
        grad_row = grad_ptr + tl.cast(row, tl.int64) * vocab
        if t == seq:
            for v0 in range(0, vocab, BLOCK):
                offs = v0 + tl.arange(0, BLOCK)
                tl.store(grad_row + offs, tl.zeros([BLOCK], dtype=grad_ptr.dtype.element_ty), mask=offs < vocab)
        else:
            token = b * seq + t
            row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
            m, s = _chunk_stats(row_ptr, 0, vocab, vocab, inv_temp, BLOCK, NUM_STAGES, HINTS, VECTOR)
            log_s = tl.log(s)
            target = tl.load(ids_ptr + token)
            x_c = tl.load(row_ptr + target).to(tl.float32)
            adv = tl.load(adv_ptr + b).to(tl.float32)
            loss, coef = _token_terms((x_c - m) * inv_temp - log_s, adv, eps_low, eps_high, inv_bst)
            tl.store(token_loss_ptr + token, loss)
            tl.store(row_m_ptr + token, m)
            tl.store(row_logs_ptr + token, log_s)
            _chunk_grad(row_ptr, grad_row, 0, vocab, vocab, inv_temp, m, log_s, coef, target, BLOCK, NUM_STAGES,
                        HINTS)


@triton.jit
def _finalize_kernel(token_loss_ptr, loss_ptr, batch, seq, BLOCK: tl.constexpr):
    """loss = mean_b( sum_t token_loss[b, t] / seq ), in a fixed order."""
    total = tl.zeros([BLOCK], tl.float32)
    n = batch * seq
    for i0 in range(0, n, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        total += tl.load(token_loss_ptr + i, mask=i < n, other=0.0)
    tl.store(loss_ptr, tl.sum(total, axis=0) / seq / batch)


@triton.jit
def _scale_kernel(grad_ptr, dloss_ptr, n, BLOCK: tl.constexpr):
    """grad *= dloss, in place; reads dloss on the device, so d loss = 1 costs no host sync."""
    scale = tl.load(dloss_ptr).to(tl.float32)
    if scale != 1.0:
        pid = tl.program_id(0)
        for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            g = tl.load(grad_ptr + offs, mask=offs < n).to(tl.float32)
            tl.store(grad_ptr + offs, (g * scale).to(grad_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _grad_from_stats_kernel(
    logits_ptr, ids_ptr, adv_ptr, row_m_ptr, row_logs_ptr, grad_ptr, dloss_ptr,
    stride_b, stride_t, seq, vocab, inv_temp, eps_low, eps_high, inv_bst, CHUNK: tl.constexpr,
):
    """Gradient from the saved per-token (max, ln S) (a second backward through the same graph):
    one read, one write."""
    row = tl.program_id(0)
    k = tl.program_id(1)  # rows x chunks as a 2-D grid: nothing waits here
    b = row // (seq + 1)
    t = row % (seq + 1)
    offs = k * CHUNK + tl.arange(0, CHUNK)
    inside = offs < vocab
    grad_row = grad_ptr + tl.cast(row, tl.int64) * vocab
    if t == seq:
        tl.store(grad_row + offs, tl.zeros([CHUNK], dtype=grad_ptr.dtype.element_ty), mask=inside)
    else:
        token = b * seq + t
        row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
        m = tl.load(row_m_ptr + token)
        log_s = tl.load(row_logs_ptr + token)
        target = tl.load(ids_ptr + token)
        adv = tl.load(adv_ptr + b).to(tl.float32)
        x_c = tl.load(row_ptr + target).to(tl.float32)
        _, coef = _token_terms((x_c - m) * inv_temp - log_s, adv, eps_low, eps_high, inv_bst)
        coef = coef * tl.load(dloss_ptr).to(tl.float32)
        x = tl.load(row_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        g = coef * (tl.exp((x - m) * inv_temp - log_s) - tl.where(offs == target, 1.0, 0.0))
        tl.store(grad_row + offs, g.to(grad_ptr.dtype.element_ty), mask=inside)
