"""The per-token terms of the staged (Gluon) member kernels (staged.py): the twins of members.py's
_differences and _policy_terms, in Gluon. Kept apart from staged.py so that module stays about the
chunk's journey (copy, reduce, wait, write) and under ~300 lines."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _member_differences(x_c, m, l2, inv_temp, inv_lo, token, old_ptr, ref_ptr, HAS_OLD: gl.constexpr,
                        HAS_KL: gl.constexpr):
    """members._differences: (logp, logp - old, ref - logp), the differences formed in float64."""
    inv64 = inv_temp.to(gl.float64) + inv_lo.to(gl.float64)
    logp64 = (x_c.to(gl.float64) - m.to(gl.float64)) * inv64 - l2.to(gl.float64) * LN2
    logp = logp64.to(gl.float32)
    lr = logp - logp
    if HAS_OLD:
        lr = (logp64 - gl.load(old_ptr + token).to(gl.float64)).to(gl.float32)
    dref = lr
    if HAS_KL:
        dref = (gl.load(ref_ptr + token).to(gl.float64) - logp64).to(gl.float32)
    return logp, lr, dref


@gluon.jit
def _member_terms(logp, lr, dref, token, adv, w, rho_ptr, eps_low, eps_high, delta, beta, cap,
                  HAS_KL: gl.constexpr, HAS_RHO: gl.constexpr, HAS_DELTA: gl.constexpr, HAS_CAP: gl.constexpr,
                  CISPO: gl.constexpr, KL_BC: gl.constexpr, RHO_MASK: gl.constexpr, SAPO: gl.constexpr):
    """Weighted (loss, dL/dlogp) of one token at log-ratio lr; ties pick the unclipped branch. SAPO:
    eps_low / eps_high are the gate temperatures (members._policy_terms)."""
    ratio = gl.exp(lr)
    if CISPO:
        cw = gl.minimum(ratio, eps_high)
        loss = -cw * adv * logp
        dlogp = -cw * adv
    elif SAPO:
        tau = gl.where(adv > 0, eps_low, eps_high)
        x = tau * (ratio - 1.0)
        e = gl.exp(-gl.maximum(x, -x))  # |x| with the calls the seed kernels use (triton 3.6 Gluon)
        s = gl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        loss = -(4.0 / tau) * s * adv
        dlogp = -4.0 * (e / ((1.0 + e) * (1.0 + e))) * ratio * adv
    else:
        c1 = ratio
        if HAS_DELTA:
            c1 = gl.minimum(ratio, delta)
        c2 = gl.minimum(gl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
        loss = -gl.minimum(c1 * adv, c2 * adv)
        full = -adv * ratio
        if HAS_DELTA:
            first = gl.where(ratio <= delta, full, 0.0)
        else:
            first = full
        second = gl.where(ratio >= 1.0 - eps_low, gl.where(ratio <= 1.0 + eps_high, full, 0.0), 0.0)
        dlogp = gl.where(c2 * adv >= c1 * adv, first, second)
    if HAS_RHO:
        rho = gl.load(rho_ptr + token).to(gl.float32)
        if HAS_CAP:
            if RHO_MASK:
                rho = gl.where(rho > cap, 0.0, rho)
            else:
                rho = gl.minimum(rho, cap)
        loss = loss * rho
        dlogp = dlogp * rho
    if HAS_KL:
        e = gl.exp(dref)
        if KL_BC:
            loss = loss + beta * (e - dref - 1.0) * ratio
            dlogp = dlogp - beta * ratio * dref
        else:
            loss = loss + beta * (e - dref - 1.0)
            dlogp = dlogp + beta * (1.0 - e)
    return loss * w, dlogp * w
