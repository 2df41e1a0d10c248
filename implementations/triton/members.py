"""Plain Triton kernels for every member of the `grpo` family (docs/architecture.md section 2).

Run everywhere (CPU interpreter included); on CUDA the two logits-reading passes of the forward
have staged (Gluon) twins in staged.py. Notation as in kernels.py: token = b * S + t (t < S),
row = b * (S + 1) + t (every logits position), m = completion mask, w = the loss type's weight.

Per-call buffer `ws` (float32, 7 * tokens + 1): [0, T) row max, [T, 2T) ln S, [2T, 3T) logp,
[3T, 4T) coef = -(dL/dlogp) / T (so dL/dz = coef * (p - onehot)), [4T, 5T) weighted token
loss, [5T, 6T) logp - old, [6T, 7T) ref - logp, [7T] the gradient mode this call's forward used
(0: written in forward, 1: left to backward), [7T + 1] the upstream scalar c_pred the forward's
gradient was multiplied by in mode 0 (the plan's prediction of d loss).

The plan's `flag` (float32 [2]): [0] the mode the next forward uses, [1] the d loss the last
backward received. Backward sets mode 0 (predict that value again) when d loss equals the last
one, else mode 1; so a training loop with a constant upstream scalar (1, 1/accumulation steps,
a loss scale) gets the gradient in the forward's pass after two calls.

Arrival counters are per plan and per kernel kind and never reset: every launch adds exactly
NUM_CHUNKS to each live token's counter, so a program's own arrival `a` tells the launch's
target, (a // NUM_CHUNKS + 1) * NUM_CHUNKS, and the last arriver is a % NUM_CHUNKS == NUM_CHUNKS
- 1 (no second atomic, no reset store; the plan re-zeroes them long before int32 wraps).

The two differences are formed in float64 (`_differences`): where |logp| ~ 5e5 (a row whose max
is far above its target) one fp32 rounding of logp is 0.03, i.e. 3% of exp(logp - old); in float64
(1/T passed as two fp32 halves) the ratio keeps fp32 accuracy.

  _norm_kernel   (sequences.py) per-sequence weights wb[b] from the mask (grpo: 1 / (B max(1, n_b)),
                 bnpo/dapo: 1 / max(1, N)); constant weights need no kernel. For TRL's sequence-level
                 vLLM modes also each sequence's sampling ratio rb[b] (issue 33).
  _stats_kernel  per (token, chunk), last arriver combines: row max, ln S and logp of every unmasked
                 token; masked rows are never read. Counters reset by whoever used them last.
  _terms_kernel  (sequences.py) the loss (and for sequence-level ratios the per-token coef) from logp.
  _main_kernel   per (row, chunk), programs of a row wait for each other (one chunk per row under
                 the interpreter): stats, token loss and coef of token-level members, and, when the
                 call's mode is 0, c_pred times the gradient too (masked and last rows: zeros,
                 logits unread). IN_BACKWARD: the backward of a member whose loss does not read
                 the logits (token-is): always the gradient, times d loss read from the device.
  _finalize_kernel  one program: loss = sum of the weighted token losses, fixed order.
  _grad_kernel   (grad.py) backward: mode 1, forced, or d loss != c_pred: the gradient from the saved
                 statistics times d loss in one read and one write; mode 0 with d loss == c_pred:
                 nothing (the forward's gradient is already right). Program 0 updates `flag`.
"""

import triton
import triton.language as tl

from .kernels import _chunk_stats, _combine


@triton.jit
def _differences(x_c, m, log_s, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD: tl.constexpr,
                 HAS_KL: tl.constexpr):
    """(logp, logp - old, ref - logp) of one token, the differences formed in float64."""
    inv64 = (tl.full([], 0.0, tl.float64) + inv_temp) + inv_lo  # scalar arguments arrive as fp32
    logp64 = (x_c.to(tl.float64) - m.to(tl.float64)) * inv64 - log_s.to(tl.float64)
    logp = logp64.to(tl.float32)
    lr = logp - logp  # exactly 0 without old log-probs (old = logp.detach())
    if HAS_OLD:
        lr = (logp64 - tl.load(old_ptr + token).to(tl.float64)).to(tl.float32)
    dref = lr
    if HAS_KL:
        dref = (tl.load(ref_ptr + token).to(tl.float64) - logp64).to(tl.float32)
    return logp, lr, dref


@triton.jit
def _policy_terms(lr, logp, adv, eps_low, eps_high, delta, HAS_DELTA: tl.constexpr, CISPO: tl.constexpr,
                  SAPO: tl.constexpr):
    """(l, dl/dlogp) of the policy term at log-ratio lr. Ties pick the unclipped branch. SAPO: eps_low
    and eps_high are the gate temperatures for A > 0 and A <= 0 (plan.semantics_of)."""
    ratio = tl.exp(lr)
    if CISPO:
        weight = tl.minimum(ratio, eps_high)  # detached: only logp carries the gradient
        loss = -weight * adv * logp
        dlogp = -weight * adv
    elif SAPO:
        tau = tl.where(adv > 0, eps_low, eps_high)
        x = tau * (ratio - 1.0)
        # s (1 - s) as e / (1 + e)^2 with e = exp(-|x|): no cancellation in 1 - s where the gate saturates
        e = tl.exp(-tl.abs(x))
        s = tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        loss = -(4.0 / tau) * s * adv
        dlogp = -4.0 * (e / ((1.0 + e) * (1.0 + e))) * ratio * adv
    else:
        c1 = ratio
        if HAS_DELTA:
            c1 = tl.minimum(ratio, delta)
        c2 = tl.minimum(tl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
        loss = -tl.minimum(c1 * adv, c2 * adv)
        first = c2 * adv >= c1 * adv
        if HAS_DELTA:
            pass1 = ratio <= delta
        else:
            pass1 = ratio == ratio
        pass2 = (ratio >= 1.0 - eps_low) & (ratio <= 1.0 + eps_high)
        dlogp = tl.where(tl.where(first, pass1, pass2), -adv * ratio, 0.0)
    return loss, dlogp


@triton.jit
def _kl_terms(d, beta):
    """k3 KL at d = ref - logp: beta * (exp(d) - d - 1) and its d/dlogp."""
    e = tl.exp(d)
    return beta * (e - d - 1.0), beta * (1.0 - e)


@triton.jit
def _token_terms(logp, lr, dref, token, adv, w, rho_ptr, eps_low, eps_high, delta, beta, cap,
                 HAS_KL: tl.constexpr, HAS_RHO: tl.constexpr, HAS_DELTA: tl.constexpr, HAS_CAP: tl.constexpr,
                 CISPO: tl.constexpr, KL_BC: tl.constexpr, RHO_MASK: tl.constexpr, SAPO: tl.constexpr):
    """Weighted (loss, dL/dlogp) of one token (or a block of tokens) of a token-level member.
    rho_ptr + token: the token's sampling ratio, or (TRL's sequence modes) its sequence's, which
    _norm_kernel formed; RHO_MASK zeroes a ratio above the cap (TRL's *_mask), else it is truncated.
    KL_BC (TRL 1.16's use_bias_correction_kl): the k3 term times r = exp(lr), whose gradient makes
    d(beta k3 r)/dlogp = -beta r (ref - logp): one product, no cancellation."""
    loss, dlogp = _policy_terms(lr, logp, adv, eps_low, eps_high, delta, HAS_DELTA, CISPO, SAPO)
    if HAS_RHO:
        rho = tl.load(rho_ptr + token).to(tl.float32)
        if HAS_CAP:
            if RHO_MASK:
                rho = tl.where(rho > cap, 0.0, rho)
            else:
                rho = tl.minimum(rho, cap)
        loss = loss * rho
        dlogp = dlogp * rho
    if HAS_KL:
        kl, dkl = _kl_terms(dref, beta)
        if KL_BC:
            ratio = tl.exp(lr)
            kl = kl * ratio
            dkl = -beta * ratio * dref
        loss = loss + kl
        dlogp = dlogp + dkl
    return loss * w, dlogp * w


@triton.jit
def _stats_kernel(logits_ptr, ids_ptr, mask_ptr, old_ptr, ref_ptr, part_ptr, count_ptr, ws_ptr, tokens,
                  stride_b, stride_t, seq, vocab, inv_temp, inv_lo,
                  CHUNK: tl.constexpr, BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
                  HAS_MASK: tl.constexpr, HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr):
    pid = tl.program_id(0)
    token = pid // NUM_CHUNKS  # chunk index fastest
    k = pid % NUM_CHUNKS
    b = token // seq
    t = token % seq
    live = True
    if HAS_MASK:
        live = tl.load(mask_ptr + token) != 0
    if live:  # a masked row is never read
        row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
        m, s = _chunk_stats(row_ptr, k * CHUNK, k * CHUNK + CHUNK, vocab, inv_temp, BLOCK, 1, False, False)
        last = True
        if NUM_CHUNKS > 1:
            tl.store(part_ptr + token * NUM_CHUNKS + k, m)
            tl.store(part_ptr + (tokens + token) * NUM_CHUNKS + k, s)
            last = tl.atomic_add(count_ptr + token, 1, sem="acq_rel") % NUM_CHUNKS == NUM_CHUNKS - 1
        if last:
            if NUM_CHUNKS > 1:
                m, log_s = _combine(part_ptr + token * NUM_CHUNKS, part_ptr + (tokens + token) * NUM_CHUNKS,
                                    inv_temp, NUM_CHUNKS, CHUNKS_P2)
            else:
                log_s = tl.log(s)
            x_c = tl.load(row_ptr + tl.load(ids_ptr + token)).to(tl.float32)
            logp, lr, dref = _differences(x_c, m, log_s, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
            tl.store(ws_ptr + token, m)
            tl.store(ws_ptr + tokens + token, log_s)
            tl.store(ws_ptr + 2 * tokens + token, logp)
            tl.store(ws_ptr + 5 * tokens + token, lr)
            tl.store(ws_ptr + 6 * tokens + token, dref)


@triton.jit
def _main_kernel(logits_ptr, ids_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, wb_ptr, rb_ptr,
                 grad_ptr, part_ptr, count_ptr, ws_ptr, flag_ptr,
                 tokens, stride_b, stride_t, seq, vocab, inv_temp, inv_lo, eps_low, eps_high, delta, beta, cap,
                 w_const, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
                 HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RHO: tl.constexpr,
                 HAS_DELTA: tl.constexpr, HAS_CAP: tl.constexpr, CISPO: tl.constexpr, KL_BC: tl.constexpr,
                 RHO_MASK: tl.constexpr, SEQ_RHO: tl.constexpr, SAPO: tl.constexpr, PER_SEQ_W: tl.constexpr,
                 HINTS: tl.constexpr, IN_BACKWARD: tl.constexpr):
    """IN_BACKWARD: flag_ptr is d loss; the gradient is always written, ws is not touched."""
    pid = tl.program_id(0)
    row = pid // NUM_CHUNKS  # chunk index fastest: a row's programs are dispatched together
    k = pid % NUM_CHUNKS
    b = row // (seq + 1)
    t = row % (seq + 1)
    if IN_BACKWARD:
        # A constexpr, so the frontend drops the statistics-only branch below (triton 3.6 cannot
        # lower a memory operation in a dead block of an `if` on a constant tensor: notes, round 8).
        write: tl.constexpr = True
        c_pred = tl.load(flag_ptr).to(tl.float32)
    else:
        mode = tl.load(flag_ptr)  # 0: the gradient now (times the predicted d loss); 1: statistics only
        c_pred = tl.load(flag_ptr + 1)
        if pid == 0:
            tl.store(ws_ptr + 7 * tokens, mode)
            tl.store(ws_ptr + 7 * tokens + 1, c_pred)
        write = mode == 0.0
    start = k * CHUNK
    grad_row = grad_ptr + tl.cast(row, tl.int64) * vocab
    token = b * seq + t
    scored = t < seq
    live = scored
    if HAS_MASK:
        live = live & (tl.load(mask_ptr + token, mask=scored, other=0) != 0)
    if live:
        row_ptr = logits_ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(t, tl.int64) * stride_t
        m, s = _chunk_stats(row_ptr, start, start + CHUNK, vocab, inv_temp, BLOCK, 1, HINTS, False)
        log_s = tl.log(s)
        writer = k == 0
        if NUM_CHUNKS > 1:
            tl.store(part_ptr + token * NUM_CHUNKS + k, m)
            tl.store(part_ptr + (tokens + token) * NUM_CHUNKS + k, s)
            if write:  # the gradient follows: wait for the row's other chunks (counters: module docstring)
                arrived = tl.atomic_add(count_ptr + token, 1, sem="release")
                target_n = (arrived // NUM_CHUNKS + 1) * NUM_CHUNKS
                while tl.atomic_add(count_ptr + token, 0, sem="acquire") < target_n:
                    pass
                m, log_s = _combine(part_ptr + token * NUM_CHUNKS, part_ptr + (tokens + token) * NUM_CHUNKS,
                                    inv_temp, NUM_CHUNKS, CHUNKS_P2)
            else:  # statistics only: nobody waits, the last chunk to arrive combines
                arrived = tl.atomic_add(count_ptr + token, 1, sem="acq_rel")
                writer = arrived % NUM_CHUNKS == NUM_CHUNKS - 1
                if writer:
                    m, log_s = _combine(part_ptr + token * NUM_CHUNKS, part_ptr + (tokens + token) * NUM_CHUNKS,
                                        inv_temp, NUM_CHUNKS, CHUNKS_P2)
        target = tl.load(ids_ptr + token)
        x_c = tl.load(row_ptr + target).to(tl.float32)
        logp, lr, dref = _differences(x_c, m, log_s, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD, HAS_KL)
        if PER_SEQ_W:
            w = tl.load(wb_ptr + b)
        else:
            w = w_const
        if SEQ_RHO:  # the sequence's sampling ratio (_norm_kernel)
            q_ptr = rb_ptr
            q_idx = b
        else:
            q_ptr = rho_ptr
            q_idx = token
        loss, dlogp = _token_terms(logp, lr, dref, q_idx, tl.load(adv_ptr + b).to(tl.float32), w, q_ptr,
                                   eps_low, eps_high, delta, beta, cap, HAS_KL, HAS_RHO, HAS_DELTA, HAS_CAP, CISPO,
                                   KL_BC, RHO_MASK, SAPO)
        coef = -dlogp * inv_temp
        if not IN_BACKWARD:
            if writer:
                tl.store(ws_ptr + token, m)
                tl.store(ws_ptr + tokens + token, log_s)
                tl.store(ws_ptr + 2 * tokens + token, logp)
                tl.store(ws_ptr + 3 * tokens + token, coef)
                tl.store(ws_ptr + 4 * tokens + token, loss)
        if write:
            coef_g = coef * c_pred
            for v0 in range(start, start + CHUNK, BLOCK):
                offs = v0 + tl.arange(0, BLOCK)
                inside = offs < vocab
                if HINTS:
                    x = tl.load(row_ptr + offs, mask=inside, other=0.0, eviction_policy="evict_first")
                else:
                    x = tl.load(row_ptr + offs, mask=inside, other=0.0)
                p = tl.exp((x.to(tl.float32) - m) * inv_temp - log_s)
                g = coef_g * (p - tl.where(offs == target, 1.0, 0.0))
                tl.store(grad_row + offs, g.to(grad_ptr.dtype.element_ty), mask=inside)
    else:
        if not IN_BACKWARD:
            if scored & (k == 0):  # a masked token: no loss, no gradient
                tl.store(ws_ptr + 3 * tokens + token, 0.0)
                tl.store(ws_ptr + 4 * tokens + token, 0.0)
        if write:
            for v0 in range(start, start + CHUNK, BLOCK):
                offs = v0 + tl.arange(0, BLOCK)
                tl.store(grad_row + offs, tl.zeros([BLOCK], dtype=grad_ptr.dtype.element_ty), mask=offs < vocab)


@triton.jit
def _finalize_kernel(ws_ptr, loss_ptr, tokens, BLOCK: tl.constexpr):
    total = tl.zeros([BLOCK], tl.float32)
    for i0 in range(0, tokens, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        total += tl.load(ws_ptr + 4 * tokens + i, mask=i < tokens, other=0.0)
    tl.store(loss_ptr, tl.sum(total, axis=0))
