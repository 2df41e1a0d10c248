"""Exact copies of the @triton.jit helpers of implementations/triton that the fused kernels reuse.

An implementation folder is copied alone into the validator's worker (its identity covers exactly its
own files; symbolic links are refused), so the fused kernel cannot import ../triton at run time. These
functions are copied verbatim from implementations/triton/kernels.py (_combine, _block_update,
_chunk_stats) and implementations/triton/members.py (_differences, _policy_terms, _kl_terms,
_token_terms); tests/test_triton_fused.py fails when a copy and its original differ, so a fix there
must be copied here (regenerate this file's bodies from those two files).
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
