"""Tiled interpreter twins of members.py's one-program kernels that loop over the sequences
(_terms_kernel, _norm_kernel): the sequences are the tile's first axis. Interpreter only (interp.py).
"""

import triton
import triton.language as tl

from .members import _kl_terms, _policy_terms, _token_terms


@triton.jit
def _rows_norm_kernel(mask_ptr, rho_ptr, wb_ptr, rb_ptr, batch, seq, GLOBAL: tl.constexpr, WRITE_W: tl.constexpr,
                      SEQ_RHO: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_T: tl.constexpr, BATCH_P2: tl.constexpr):
    """members._norm_kernel with every sequence at once (a [BATCH_P2, BLOCK_T] tile)."""
    b = tl.arange(0, BATCH_P2).to(tl.int64)  # int64: no overflow checks to interpret
    in_b = b < batch
    n = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    lq = tl.zeros([BATCH_P2, BLOCK_T], tl.float64)
    for t0 in range(0, seq, BLOCK_T):
        t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
        idx = b[:, None] * seq + t[None, :]
        live = in_b[:, None] & (t[None, :] < seq)
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + idx, mask=live, other=0) != 0)
        n += tl.where(live, 1.0, 0.0)
        if SEQ_RHO:
            q = tl.load(rho_ptr + idx, mask=live, other=1.0).to(tl.float32)
            lq += tl.where(live, tl.log(q), 0.0).to(tl.float64)
    n_b = tl.sum(n, axis=1)
    if SEQ_RHO:
        tl.store(rb_ptr + b, tl.exp(tl.sum(lq, axis=1).to(tl.float32)), mask=in_b)
    if WRITE_W:
        if GLOBAL:
            total = tl.sum(n_b, axis=0)  # whole counts: exact in any order
            tl.store(wb_ptr + b, tl.zeros([BATCH_P2], tl.float32) + 1.0 / tl.maximum(total, 1.0), mask=in_b)
        else:
            tl.store(wb_ptr + b, 1.0 / (batch * tl.maximum(n_b, 1.0)), mask=in_b)


@triton.jit
def _rows_terms_kernel(ws_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, rb_ptr, loss_ptr,
                       batch, seq, tokens, inv_temp, inv_lo, eps_low, eps_high, delta, beta, cap, w_const,
                       vk_pos, vl_pos, vk_neg, vl_neg,
                       HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RHO: tl.constexpr,
                       HAS_DELTA: tl.constexpr, HAS_CAP: tl.constexpr, CISPO: tl.constexpr, KL_BC: tl.constexpr,
                       RHO_MASK: tl.constexpr, SEQ_RHO: tl.constexpr, SAPO: tl.constexpr, NEEDS_LOGP: tl.constexpr,
                       NORM: tl.constexpr, SEQUENCE: tl.constexpr, VESPO: tl.constexpr, WRITE_COEF: tl.constexpr,
                       BLOCK_T: tl.constexpr, BATCH_P2: tl.constexpr):
    """members._terms_kernel with every sequence at once: its loop over b is the tile's first axis
    ([BATCH_P2, BLOCK_T]), the loss accumulated per (sequence, lane) and summed over the sequences in
    order, then over the lanes (the plain kernel's order where a sequence fits one block)."""
    b = tl.arange(0, BATCH_P2).to(tl.int64)  # int64: no overflow checks to interpret
    in_b = b < batch
    b_safe = tl.where(in_b, b, 0)
    T = tokens.to(tl.int64)
    adv = tl.load(adv_ptr + b_safe).to(tl.float32)
    n_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    lr_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    rho_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    if HAS_MASK or SEQUENCE or VESPO:
        for t0 in range(0, seq, BLOCK_T):
            t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
            idx = b[:, None] * seq + t[None, :]
            live = in_b[:, None] & (t[None, :] < seq)
            if HAS_MASK:
                live = live & (tl.load(mask_ptr + idx, mask=live, other=0) != 0)
            n_acc += tl.where(live, 1.0, 0.0)
            if SEQUENCE:
                lr_acc += tl.where(live, tl.load(ws_ptr + 5 * T + idx, mask=live, other=0.0), 0.0)
            if VESPO:
                if HAS_OLD:
                    lr_t = tl.load(ws_ptr + 5 * T + idx, mask=live, other=0.0)
                    lr_acc += tl.where(live, tl.minimum(tl.maximum(lr_t, -20.0), 20.0), 0.0)
                if HAS_RHO:
                    rho = tl.load(rho_ptr + idx, mask=live, other=0.0).to(tl.float32)
                    if HAS_CAP:
                        if RHO_MASK:
                            rho = tl.where(rho > cap, 0.0, rho)
                        else:
                            rho = tl.minimum(rho, cap)
                    rho_acc += tl.where(live, rho, 0.0)
    n_b = tl.sum(n_acc, axis=1)
    if NORM == 1 and HAS_MASK:
        wb = 1.0 / (batch * tl.maximum(n_b, 1.0))
    elif NORM == 2 and HAS_MASK:
        wb = tl.zeros([BATCH_P2], tl.float32) + 1.0 / tl.maximum(tl.sum(n_b, axis=0), 1.0)
    else:
        wb = tl.zeros([BATCH_P2], tl.float32) + w_const
    loss_acc = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
    seq_coef = tl.zeros([BATCH_P2], tl.float32)
    phi = tl.zeros([BATCH_P2], tl.float32)
    if VESPO:
        u = tl.minimum(tl.maximum(tl.sum(lr_acc, axis=1), -18.420680743952367), 20.0)
        k_b = tl.where(adv >= 0, vk_pos, vk_neg)
        lam_b = tl.where(adv >= 0, vl_pos, vl_neg)
        phi = tl.exp(lam_b + k_b * u - lam_b * tl.exp(u))
        phi = tl.where(tl.abs(phi) < float("inf"), phi, 0.0)
    if SEQUENCE:
        mean_lr = tl.sum(lr_acc, axis=1) / tl.maximum(n_b, 1.0)
        l_s, dl_s = _policy_terms(mean_lr, mean_lr, adv, eps_low, eps_high, delta, HAS_DELTA, False, False)
        if HAS_RHO:
            weight_sum = wb * tl.sum(rho_acc, axis=1)
        else:
            weight_sum = wb * n_b
        first = (tl.arange(0, BLOCK_T) == 0)[None, :] & in_b[:, None]
        loss_acc += tl.where(first, (l_s * weight_sum)[:, None], 0.0)
        seq_coef = dl_s * weight_sum / tl.maximum(n_b, 1.0)
    for t0 in range(0, seq, BLOCK_T):
        t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
        token = b[:, None] * seq + t[None, :]
        inside = in_b[:, None] & (t[None, :] < seq)
        live = inside
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + token, mask=inside, other=0) != 0)
        tok = tl.where(live, token, 0)
        if NEEDS_LOGP:
            logp = tl.load(ws_ptr + 2 * T + tok, mask=live, other=0.0)
            lr = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
            if HAS_OLD:
                lr = tl.load(ws_ptr + 5 * T + tok, mask=live, other=0.0)
            dref = tl.load(ws_ptr + 6 * T + tok, mask=live, other=0.0)
        else:
            logp = tl.zeros([BATCH_P2, BLOCK_T], tl.float32)
            lr = logp
            dref = logp
        if SEQUENCE:
            dlogp = tl.zeros([BATCH_P2, BLOCK_T], tl.float32) + seq_coef[:, None]
            if HAS_KL:
                kl, dkl = _kl_terms(dref, beta)
                loss_acc += tl.where(live, kl * wb[:, None], 0.0)
                dlogp = dlogp + dkl * wb[:, None]
        elif VESPO:
            loss = -phi[:, None] * adv[:, None] * logp
            dlogp = tl.zeros([BATCH_P2, BLOCK_T], tl.float32) - (phi * adv)[:, None]
            if HAS_KL:
                kl, dkl = _kl_terms(dref, beta)
                loss = loss + kl
                dlogp = dlogp + dkl
            loss_acc += tl.where(live, loss * wb[:, None], 0.0)
            dlogp = dlogp * wb[:, None]
        else:
            if SEQ_RHO:
                q_ptr = rb_ptr
                q_idx = b_safe[:, None]
            else:
                q_ptr = rho_ptr
                q_idx = tok
            loss, dlogp = _token_terms(logp, lr, dref, q_idx, adv[:, None], wb[:, None], q_ptr, eps_low, eps_high,
                                       delta, beta, cap, HAS_KL, HAS_RHO, HAS_DELTA, HAS_CAP, CISPO, KL_BC, RHO_MASK,
                                       SAPO)
            loss_acc += tl.where(live, loss, 0.0)
        if WRITE_COEF:
            tl.store(ws_ptr + 3 * T + token, tl.where(live, -dlogp * inv_temp, 0.0), mask=inside)
    tl.store(loss_ptr, tl.sum(tl.sum(loss_acc, axis=0), axis=0))
