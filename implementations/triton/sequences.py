"""The member kernels that reduce over sequences (one program each): `_norm_kernel` (per-sequence
weights and sampling ratios) and `_terms_kernel` (the loss, and for sequence-level ratios the
per-token coef, from logp). Notation and the buffer `ws` as in members.py.

Each program holds BLOCK_B sequences a tile ([BLOCK_B, BLOCK_T]) and walks the batch in such
tiles. Why: looping over the sequences one at a time left each sequence's mask loads waiting for
the previous sequence's sum, eight latency-bound rounds at batch 8 before the main kernel could
start (16.9 us of a 342 us call on an H100; tiled 6.9 us: docs/triton-kernel-notes.md, "The norm
and terms kernels tiled"). On a GPU the plan keeps a tile at NORM_TILE elements (plan.py); the
interpreter passes the whole batch as one tile (interp.py), where every `tl` operation costs the
same whatever its size.

Index arithmetic is int64 (the interpreter checks every int32 add and multiply for overflow). The
loss is accumulated per (sequence slot, lane) over the tiles, then summed over the slots and the
lanes: a fixed order for a given tile height, so every call of a plan gives the same bits.
"""

import triton
import triton.language as tl

from .members import _kl_terms, _policy_terms, _token_terms


@triton.jit
def _norm_kernel(mask_ptr, rho_ptr, wb_ptr, rb_ptr, batch, seq, GLOBAL: tl.constexpr, WRITE_W: tl.constexpr,
                 SEQ_RHO: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr):
    """WRITE_W: the per-sequence weights wb (grpo: 1 / (B max(1, n_b)); GLOBAL, bnpo/dapo: 1 / max(1, N));
    SEQ_RHO: rb[b] = exp(sum_t m log sampling_ratio[b, t]), the sequence's ratio of TRL's sequence modes
    (logs summed in float64)."""
    total = 0.0
    for b0 in range(0, batch, BLOCK_B):
        b = tl.arange(0, BLOCK_B).to(tl.int64) + b0
        in_b = b < batch
        n = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
        lq = tl.zeros([BLOCK_B, BLOCK_T], tl.float64)
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
        total += tl.sum(n_b, axis=0)  # whole counts: exact in any order
        if SEQ_RHO:
            tl.store(rb_ptr + b, tl.exp(tl.sum(lq, axis=1).to(tl.float32)), mask=in_b)
        if WRITE_W:
            if not GLOBAL:
                tl.store(wb_ptr + b, 1.0 / (batch * tl.maximum(n_b, 1.0)), mask=in_b)
    if WRITE_W:
        if GLOBAL:
            for b0 in range(0, batch, BLOCK_B):
                b = tl.arange(0, BLOCK_B).to(tl.int64) + b0
                tl.store(wb_ptr + b, tl.zeros([BLOCK_B], tl.float32) + 1.0 / tl.maximum(total, 1.0), mask=b < batch)


@triton.jit
def _mask_count(mask_ptr, batch, seq, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr):
    """N, the kept tokens of the whole batch (bnpo and dapo's normaliser)."""
    acc = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
    for b0 in range(0, batch, BLOCK_B):
        b = tl.arange(0, BLOCK_B).to(tl.int64) + b0
        for t0 in range(0, seq, BLOCK_T):
            t = tl.arange(0, BLOCK_T).to(tl.int64) + t0
            live = (b < batch)[:, None] & (t[None, :] < seq)
            acc += tl.where(tl.load(mask_ptr + b[:, None] * seq + t[None, :], mask=live, other=0) != 0, 1.0, 0.0)
    return tl.sum(tl.sum(acc, axis=1), axis=0)


@triton.jit
def _terms_kernel(ws_ptr, adv_ptr, old_ptr, ref_ptr, mask_ptr, rho_ptr, rb_ptr, loss_ptr,
                  batch, seq, tokens, inv_temp, inv_lo, eps_low, eps_high, delta, beta, cap, w_const,
                  vk_pos, vl_pos, vk_neg, vl_neg,
                  HAS_OLD: tl.constexpr, HAS_KL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RHO: tl.constexpr,
                  HAS_DELTA: tl.constexpr, HAS_CAP: tl.constexpr, CISPO: tl.constexpr, KL_BC: tl.constexpr,
                  RHO_MASK: tl.constexpr, SEQ_RHO: tl.constexpr, SAPO: tl.constexpr, NEEDS_LOGP: tl.constexpr,
                  NORM: tl.constexpr, SEQUENCE: tl.constexpr, VESPO: tl.constexpr, WRITE_COEF: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr):
    """NORM: 0 constant weight w_const, 1 per sequence (grpo), 2 over the batch (bnpo, dapo). SEQ_RHO:
    rb_ptr holds each sequence's sampling ratio (_norm_kernel ran first); sequence level (SEQUENCE)
    supports neither SEQ_RHO nor KL_BC (plan.semantics_of refuses them).
    VESPO: phi_b = exp(lambda + k u - lambda e^u) of u = clamp(sum_t m clamp(logp - old, +-20), ln 1e-8, 20),
    (k, lambda) = (vk_pos, vl_pos) where A >= 0 else (vk_neg, vl_neg); l = -phi_b A logp, phi_b constant."""
    # tokens + an int64 zero, not tokens.to(): the JIT passes an argument equal to 1 as a constexpr (batch 1,
    # seq 1), which has no .to()
    T = tokens + tl.zeros((), tl.int64)
    total_n = 0.0
    if HAS_MASK and NORM == 2:
        total_n = _mask_count(mask_ptr, batch, seq, BLOCK_T, BLOCK_B)
    loss_acc = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
    for b0 in range(0, batch, BLOCK_B):
        b = tl.arange(0, BLOCK_B).to(tl.int64) + b0
        in_b = b < batch
        b_safe = tl.where(in_b, b, 0)
        adv = tl.load(adv_ptr + b_safe).to(tl.float32)
        n_acc = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
        lr_acc = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
        rho_acc = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
        if (HAS_MASK and NORM == 1) or SEQUENCE or VESPO:
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
            wb = tl.zeros([BLOCK_B], tl.float32) + 1.0 / tl.maximum(total_n, 1.0)
        else:
            wb = tl.zeros([BLOCK_B], tl.float32) + w_const
        seq_coef = tl.zeros([BLOCK_B], tl.float32)
        phi = tl.zeros([BLOCK_B], tl.float32)
        if VESPO:  # TRL's get_gamma_weights; a non-finite weight counts as 0, as its nan_to_num
            u = tl.minimum(tl.maximum(tl.sum(lr_acc, axis=1), -18.420680743952367), 20.0)
            k_b = tl.where(adv >= 0, vk_pos, vk_neg)
            lam_b = tl.where(adv >= 0, vl_pos, vl_neg)
            phi = tl.exp(lam_b + k_b * u - lam_b * tl.exp(u))
            phi = tl.where(tl.abs(phi) < float("inf"), phi, 0.0)
        if SEQUENCE:  # every token of sequence b uses s_b = exp(sum_t m (logp - old) / max(1, n_b))
            mean_lr = tl.sum(lr_acc, axis=1) / tl.maximum(n_b, 1.0)
            l_s, dl_s = _policy_terms(mean_lr, mean_lr, adv, eps_low, eps_high, delta, HAS_DELTA, False, False)
            if HAS_RHO:
                weight_sum = wb * tl.sum(rho_acc, axis=1)
            else:
                weight_sum = wb * n_b
            first = (tl.arange(0, BLOCK_T) == 0)[None, :] & in_b[:, None]
            loss_acc += tl.where(first, (l_s * weight_sum)[:, None], 0.0)
            # dL/dlogp[b, t] = m[b, t] / max(1, n_b) * (sum_t w rho) * dl/dlogs
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
                lr = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
                if HAS_OLD:
                    lr = tl.load(ws_ptr + 5 * T + tok, mask=live, other=0.0)
                dref = tl.load(ws_ptr + 6 * T + tok, mask=live, other=0.0)
            else:
                logp = tl.zeros([BLOCK_B, BLOCK_T], tl.float32)
                lr = logp
                dref = logp
            if SEQUENCE:
                dlogp = tl.zeros([BLOCK_B, BLOCK_T], tl.float32) + seq_coef[:, None]
                if HAS_KL:
                    kl, dkl = _kl_terms(dref, beta)
                    loss_acc += tl.where(live, kl * wb[:, None], 0.0)
                    dlogp = dlogp + dkl * wb[:, None]
            elif VESPO:
                loss = -phi[:, None] * adv[:, None] * logp
                dlogp = tl.zeros([BLOCK_B, BLOCK_T], tl.float32) - (phi * adv)[:, None]
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
                loss, dlogp = _token_terms(logp, lr, dref, q_idx, adv[:, None], wb[:, None], q_ptr, eps_low,
                                           eps_high, delta, beta, cap, HAS_KL, HAS_RHO, HAS_DELTA, HAS_CAP, CISPO,
                                           KL_BC, RHO_MASK, SAPO)
                loss_acc += tl.where(live, loss, 0.0)
            if WRITE_COEF:
                tl.store(ws_ptr + 3 * T + token, tl.where(live, -dlogp * inv_temp, 0.0), mask=inside)
    tl.store(loss_ptr, tl.sum(tl.sum(loss_acc, axis=0), axis=0))
