"""The float64 reference for every member of the `grpo` family (docs/architecture.md s. 2).

Everything is computed on the upcast input values in float64. Two steps, so that memory stays
bounded whatever the batch and a sequence-level ratio can couple a whole sequence:
1. log-probs logp [B, S] of the target tokens, chunk by chunk over rows of the logits;
2. on the small [B, S] grid, the closed-form per-token loss and dL/dlogp (ratio, clip branch,
   cispo weight, vLLM correction, k3 KL, the loss type's weights w, GSPO's sequence coupling);
3. the gradient, chunk by chunk: dL/dz[b,t,v] = dL/dlogp[b,t] / T * (onehot(c[b,t]) - softmax(z[b,t]/T)),
   exactly 0 on row t = S and on masked rows.
Chunks hold whole sequences when one fits the budget, else runs of rows; either way a chunk's
values need nothing of other chunks (step 2 saw the whole grid). The closed form is checked
against autograd in float64 for every member (tests/test_reference_members.py).

Ties: where the unclipped and the clipped term are equal the unclipped branch is active
(gradient -A*r times its coefficient's derivative), as TRL (torch.min splits, torch.clamp
passes at its bounds: the halves add up), verl and Liger define it.

The public API takes the inputs as a mapping by input name (`x["logits"]`, ...) and a
`GrpoParameters`; the pre-family positional form `f(logits, completion_ids, advantages, params)`
still works for existing callers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping, Optional

import torch

DEFAULT_BUDGET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GrpoParameters:
    epsilon_low: float
    epsilon_high: float
    temperature: float
    loss_type: str = "grpo"
    importance_sampling_level: str = "token"
    beta: float = 0.0
    max_completion_length: Optional[int] = None
    delta: Optional[float] = None
    sampling_ratio_cap: Optional[float] = None
    num_items_in_batch: Optional[int] = None
    num_processes: int = 1
    # sapo and vespo (TRL 1.16's defaults)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "GrpoParameters":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in values.items() if k in known and v is not None}
        for k in ("epsilon_low", "epsilon_high", "temperature", "beta", "delta", "sampling_ratio_cap",
                  "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                  "vespo_lambda_neg"):
            if k in kw:
                kw[k] = float(kw[k])
        return cls(**kw)

    @classmethod
    def from_spec(cls, spec: Any, values: Mapping[str, Any] | None = None) -> "GrpoParameters":
        """The spec's declared defaults, overridden by `values` (drawn ones); undeclared terms are off."""
        merged = dict(spec.parameter_values)
        merged.update({k: v for k, v in (values or {}).items() if k in merged})
        return cls.from_mapping(merged)


@dataclass(frozen=True)
class GradientChunk:
    """Reference gradient for flattened logits rows [start, stop) (rows run over batch * seq_next)."""

    start: int
    stop: int
    values: torch.Tensor  # float64 [stop - start, vocab]
    scale: torch.Tensor  # float64 [stop - start]: s = (sum of |terms of dL/dlogp|) / T >= any |element| of the row
    # Only when the gradient is asked with `logp_error` (see `TokenTerms`), else None; float64 [stop - start]:
    coef: Optional[torch.Tensor] = None  # dL/dlogp / T of the row (signed): values = coef * (onehot - softmax)
    coef_error: Optional[torch.Tensor] = None  # bound of |change of coef| under the log-prob errors
    loss_error: Optional[torch.Tensor] = None  # bound of |change of the row's weighted loss term| under them


def rows_per_chunk(vocab: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> int:
    # About four float64 temporaries of a chunk are alive at once.
    return max(1, budget_bytes // (4 * 8 * vocab))


def chunk_bounds(batch: int, seq_next: int, vocab: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> list[tuple[int, int]]:
    rows, step = batch * seq_next, rows_per_chunk(vocab, budget_bytes)
    if step >= seq_next:
        step -= step % seq_next  # whole sequences
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


def _rows(logits: torch.Tensor, ids: torch.Tensor, start: int, stop: int):
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    rows = torch.arange(start, stop, device=logits.device)
    b, t = rows // seq_next, rows % seq_next
    z = logits.reshape(batch * seq_next, vocab)[start:stop].to(torch.float64)
    valid = t < seq
    target = torch.zeros_like(rows)
    if seq > 0:
        target[valid] = ids[b[valid], t[valid]].to(torch.int64)
    return z, b, t, valid, target


def reference_logprobs(x: Mapping[str, torch.Tensor], p: GrpoParameters, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> torch.Tensor:
    """float64 logp[b, t] = z[c]/T - logsumexp(z/T) for t < S (row S is never read)."""
    logits, ids = x["logits"], x["completion_ids"]
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    out = torch.zeros(batch, max(seq, 0), dtype=torch.float64, device=logits.device)
    for start, stop in chunk_bounds(batch, seq_next, vocab, budget_bytes):
        z, b, t, valid, target = _rows(logits, ids, start, stop)
        if bool(valid.any()):
            scaled = z[valid] / p.temperature
            lp = scaled.gather(-1, target[valid].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
            out[b[valid], t[valid]] = lp
    return out


def needs_logprobs(x: Mapping[str, torch.Tensor], p: GrpoParameters) -> bool:
    """On-policy clip without KL (member token-is, the seed spec): the ratio is exactly 1, logp is not needed."""
    return "old_logprobs" in x or p.loss_type == "cispo" or ("ref_logprobs" in x and p.beta != 0.0)


def mask_of(x: Mapping[str, torch.Tensor], shape: tuple[int, int], device) -> torch.Tensor:
    if "completion_mask" in x:
        return (x["completion_mask"] != 0).to(device)
    return torch.ones(shape, dtype=torch.bool, device=device)


def token_weights(m: torch.Tensor, p: GrpoParameters) -> torch.Tensor:
    """w[b,t] of loss = sum w*l for the loss type (masked tokens get 0)."""
    mf = m.to(torch.float64)
    batch, seq = m.shape
    lt = p.loss_type.replace("-", "_")
    if lt == "grpo":
        return mf / (batch * mf.sum(-1, keepdim=True).clamp_min(1.0))
    if lt == "luspo":  # TRL 1.16: (per_token_loss * mask).sum(-1).mean()
        return mf / batch
    if lt == "dr_grpo":
        return mf / (batch * (p.max_completion_length if p.max_completion_length is not None else max(1, seq)))
    if lt == "sapo":
        return mf / (batch * mf.sum(-1, keepdim=True).clamp_min(1.0))
    if lt in ("dapo", "cispo", "vespo") and p.num_items_in_batch is not None:
        return mf / max(1.0, float(p.num_items_in_batch) / float(p.num_processes or 1))
    if lt in ("bnpo", "dapo", "cispo", "vespo"):
        return mf / max(1.0, float(mf.sum()))
    raise ValueError(f"loss_type {p.loss_type!r} has no reference (expected grpo, bnpo, dr_grpo, dapo, cispo, sapo, "
                     "luspo, vespo)")


@dataclass(frozen=True)
class TokenTerms:
    """On the [B, S] grid: the weighted per-token loss (sums to the loss), dL/dlogp, and the scale
    the tolerances use: the sum of the magnitudes of the terms that make dL/dlogp (the policy term,
    and the KL term counted as w*beta*(1 + exp(d))), an upper bound of |dL/dlogp| that does not
    shrink where the terms cancel. An fp32 log-sum-exp error e in logp moves each term by about e
    times its own magnitude, so a cancellation must not make the allowance smaller than that."""

    loss: torch.Tensor
    dlogp: torch.Tensor
    scale: torch.Tensor
    coef_error: torch.Tensor | None = None
    loss_error: torch.Tensor | None = None


def token_terms(x: Mapping[str, torch.Tensor], p: GrpoParameters, logp: torch.Tensor | None,
                logp_error: torch.Tensor | None = None) -> TokenTerms:
    """The closed form of the loss and of dL/dlogp; `logp` may be None when `needs_logprobs` is False.

    `logp_error` [B, S] (optional): a bound e of how far an implementation's log-probs may be from
    the float64 ones (an fp32 log-softmax: `compare.fp32_logp_error`). Then `coef_error` bounds how
    far dL/dlogp moves and `loss_error` how far each weighted per-token loss moves when every logp
    is off by at most e, propagated through this closed form (docs/checks.md, "fp32 log-prob error
    through the ratio"), every branch held: the ratio moves by at most r * expm1(e) (at sequence
    level by the mean e of the sequence), so
      - a term linear in r (the active branch of the clip, r <= delta; CISPO's weight below its cap)
        moves by |term| * expm1(e); a flat one (clipped, capped) does not move;
      - CISPO's loss -w c A rho logp also moves through logp itself and through the weight c, which
        dL/dlogp leaves out (it is detached): w |A| rho (c e + dc (|logp| + e)), dc = c expm1(e);
      - the k3 KL term's derivative w beta (1 - exp(ref - logp)) by w |beta| exp(ref - logp) expm1(e),
        its loss by w |beta| (exp(ref - logp) expm1(e) + e).
    Holding the branch is exact for the validator's inputs: generated ratios stay `boundary_margin`
    (2%) from every boundary, above the largest e of an fp32 workload (1.3%), and exact-tie inputs are
    ties in fp32 arithmetic itself. Without log-probs (`logp` None: the ratio is exactly 1 in any
    arithmetic) nothing moves."""
    adv = x["advantages"].to(torch.float64)
    batch, seq = x["completion_ids"].shape
    device = adv.device
    m = mask_of(x, (batch, seq), device)
    mf = m.to(torch.float64)
    w = token_weights(m, p)
    A = adv.reshape(batch, 1).expand(batch, seq)
    if logp is None:
        logp = torch.zeros(batch, seq, dtype=torch.float64, device=device)
    old = x["old_logprobs"].to(torch.float64) if "old_logprobs" in x else logp
    log_ratio = torch.where(m, logp - old, torch.zeros_like(logp))  # masked: finite whatever they hold
    n = mf.sum(-1, keepdim=True).clamp_min(1.0)
    sequence = p.importance_sampling_level == "sequence"
    r = torch.exp((log_ratio * mf).sum(-1, keepdim=True) / n).expand(batch, seq) if sequence else torch.exp(log_ratio)
    rho = torch.ones_like(r)
    if "sampling_ratio" in x:
        rho = x["sampling_ratio"].to(torch.float64)
        if p.sampling_ratio_cap is not None:
            rho = rho.clamp(max=p.sampling_ratio_cap)
        rho = torch.where(m, rho, torch.zeros_like(rho))
    moves = logp_error is not None and needs_logprobs(x, p)
    if moves:
        e = torch.where(m, logp_error.to(torch.float64).to(device), torch.zeros_like(logp))
        # the ratio's relative error: exp(e) - 1 of its log's error (at sequence level the mean of the sequence)
        g = torch.expm1((e * mf).sum(-1, keepdim=True) / n).expand(batch, seq) if sequence else torch.expm1(e)
    floor = None  # a part of the row scale below which float32 cannot resolve dL/dlogp (sapo, vespo)
    if p.loss_type == "sapo":
        terms = _sapo_terms(r, A, rho, w, p, g if moves else None)
        loss, dlogp, floor = terms[0], terms[1], terms[2]
        if moves:
            coef_error, loss_error = terms[3], terms[4]
    elif p.loss_type == "vespo":
        phi = vespo_weight(log_ratio, mf, A, p)
        loss = -phi * A * logp * rho
        dlogp = w * (-phi * A) * rho
        floor = w * A.abs() * rho * VESPO_PHI_FLOOR
        if moves:
            dphi = _vespo_weight_error(log_ratio, mf, A, p, (e * mf).sum(-1, keepdim=True), phi)
            coef_error = w * (dphi * A.abs()) * rho
            loss_error = w * A.abs() * rho * (phi * e + dphi * (logp.abs() + e))
    elif p.loss_type == "cispo":
        c = r.clamp(max=p.epsilon_high)
        loss = -c * A * logp * rho
        dlogp = w * (-c * A) * rho
        if moves:
            dc = torch.where(r <= p.epsilon_high, c * g, torch.zeros_like(c))  # the cap is flat
            coef_error = w * (dc * A.abs()) * rho
            loss_error = w * A.abs() * rho * (c * e + dc * (logp.abs() + e))
    else:
        delta = math.inf if p.delta is None else p.delta
        lo, hi = 1.0 - p.epsilon_low, 1.0 + p.epsilon_high
        c1, c2 = r.clamp(max=delta), r.clamp(lo, hi)
        unclipped = c1 * A <= c2 * A  # ties: the unclipped branch is active
        loss = -torch.where(unclipped, c1 * A, c2 * A) * rho
        dl_dr = -A * torch.where(unclipped, (r <= delta).to(r.dtype), ((r >= lo) & (r <= hi)).to(r.dtype)) * rho
        if sequence:  # every token of b feels s_b: sum over the sequence, then d s_b / d logp[b,t] = s_b m / n_b
            dlogp = (w * dl_dr).sum(-1, keepdim=True) * r * mf / n
        else:
            dlogp = w * dl_dr * r
        if moves:  # dl_dr is 0 on a flat branch and -A rho on a linear one: both terms are linear in r there
            coef_error = dlogp.abs() * g
            loss_error = (w * dl_dr).abs() * r * g
    scale = dlogp.abs() if floor is None else dlogp.abs() + floor
    if "ref_logprobs" in x and p.beta != 0.0:
        d = torch.where(m, x["ref_logprobs"].to(torch.float64) - logp, torch.zeros_like(logp))
        loss = loss + p.beta * (torch.exp(d) - d - 1.0)
        dlogp = dlogp + w * p.beta * (1.0 - torch.exp(d))
        scale = scale + w * abs(p.beta) * (1.0 + torch.exp(d))
        if moves:
            coef_error = coef_error + w * abs(p.beta) * torch.exp(d) * torch.expm1(e)
            loss_error = loss_error + w * abs(p.beta) * (torch.exp(d) * torch.expm1(e) + e)
    zero = torch.zeros_like(loss)
    if not moves:
        coef_error = loss_error = None if logp_error is None else zero
    else:
        coef_error, loss_error = torch.where(m, coef_error, zero), torch.where(m, loss_error, zero)
    return TokenTerms(torch.where(m, w * loss, zero), torch.where(m, dlogp, zero), torch.where(m, scale, zero),
                      coef_error, loss_error)


def _sapo_terms(r, A, rho, w, p: GrpoParameters, g=None):
    """SAPO (TRL 1.16 `loss_type="sapo"`): l = -(4/tau) sigmoid(tau (r - 1)) A, tau by the sign of A
    (A > 0: positive); dl/dlogp = -4 s (1 - s) r A. With the ratio's relative error g, how far the
    coefficient and the loss move: the gate is monotone in r (loss: its ends), the coefficient is
    not, so it is sampled at 9 points of the interval r * exp([-e, e])."""
    tau = torch.where(A > 0, torch.full_like(A, p.sapo_temperature_pos), torch.full_like(A, p.sapo_temperature_neg))

    def gate(ratio):
        return torch.sigmoid(tau * (ratio - 1.0))

    def slope(ratio):  # s (1 - s) as sigmoid(x) sigmoid(-x): 1 - s would round to 0 in float64 beyond x ~ 37
        x = tau * (ratio - 1.0)
        return torch.sigmoid(x) * torch.sigmoid(-x)

    s = gate(r)
    gg = slope(r)
    loss = -(4.0 / tau) * s * A * rho
    dlogp = w * (-4.0 * gg * r * A) * rho
    # s (1 - s) is a difference s - s^2 of terms up to 1: float32 resolves 1 - s to half an ulp of s
    # (2^-25), so an honest kernel (TRL's autograd of torch.sigmoid included) errs by up to 2^-24 in
    # it, and returns 0 where it lies below that. The scale's share 4 r |A| w min(2^-4, 2^20 s (1 - s))
    # makes the smallest row allowance (1e-6 of the scale, float32) cover exactly that, and it
    # vanishes with s (1 - s) where the ratio is far out (the gradient there is 0 in every precision).
    floor = w * 4.0 * r * A.abs() * rho * torch.minimum(torch.full_like(gg, 2.0**-4), gg * 2.0**20)
    if g is None:
        return loss, dlogp, floor
    e = torch.log1p(g)
    coef_error = torch.zeros_like(r)
    for f in torch.linspace(-1.0, 1.0, 9, dtype=torch.float64):
        rr = r * torch.exp(e * f)
        coef_error = torch.maximum(coef_error, (4.0 * slope(rr) * rr - 4.0 * gg * r).abs())
    ends = torch.maximum((gate(r * torch.exp(e)) - s).abs(), (gate(r * torch.exp(-e)) - s).abs())
    return loss, dlogp, floor, w * coef_error * A.abs() * rho, w * (4.0 / tau) * ends * A.abs() * rho


# float32 holds phi only down to 2^-126 (normal; it underflows to 0 below ~2^-149), so a kernel's phi
# is resolved to 2^-126 absolute: this share of the row scale, w |A| 2^-100, gives the smallest row
# allowance (1e-6 of the scale, float32) 2^-120 > 2^-126, and nothing that a phi above ~1e-30 feels.
VESPO_PHI_FLOOR = 2.0**-100
_VESPO_LOW = math.log(1e-8)  # TRL clamps the sequence's log ratio to [log 1e-8, 20], each token's to [-20, 20]


def _vespo_shape(A, p: GrpoParameters):
    pos = A >= 0
    k = torch.where(pos, torch.full_like(A, p.vespo_k_pos), torch.full_like(A, p.vespo_k_neg))
    lam = torch.where(pos, torch.full_like(A, p.vespo_lambda_pos), torch.full_like(A, p.vespo_lambda_neg)).clamp_min(1e-4)
    return k, lam


def _phi(u, k, lam):
    return torch.nan_to_num(torch.exp(lam + k * u - lam * torch.exp(u)), nan=0.0, posinf=0.0, neginf=0.0)


def vespo_weight(log_ratio, mf, A, p: GrpoParameters):
    """VESPO's gamma weight phi_b (TRL 1.16 `get_gamma_weights`), broadcast over the sequence: a
    constant of the loss (detached)."""
    raw = (log_ratio.clamp(-20.0, 20.0) * mf).sum(-1, keepdim=True)
    k, lam = _vespo_shape(A, p)
    return _phi(raw.clamp(_VESPO_LOW, 20.0), k, lam).expand_as(log_ratio)


def _vespo_weight_error(log_ratio, mf, A, p: GrpoParameters, err_sum, phi):
    """How far phi_b moves when the sequence's log-ratio sum moves by at most err_sum (both clamps are
    monotone and 1-Lipschitz, so the clamped sum stays in [clamp(s - E), clamp(s + E)]): phi is
    unimodal in u (peak at log(k / lambda)), so its ends and the peak bound it."""
    raw = (log_ratio.clamp(-20.0, 20.0) * mf).sum(-1, keepdim=True)
    k, lam = _vespo_shape(A, p)
    lo, hi = (raw - err_sum).clamp(_VESPO_LOW, 20.0), (raw + err_sum).clamp(_VESPO_LOW, 20.0)
    peak = torch.log(k.clamp_min(1e-300) / lam).clamp(min=lo, max=hi)
    base = phi[:, :1]
    out = torch.zeros_like(base)
    for u in (lo, hi, peak):
        out = torch.maximum(out, (_phi(u, k, lam) - base).abs())
    return out.expand_as(phi)


def _terms(x, p, budget_bytes, logp_error=None):
    logp = reference_logprobs(x, p, budget_bytes) if needs_logprobs(x, p) else None
    return token_terms(x, p, logp, logp_error)


def chunked_loss(x: Mapping[str, torch.Tensor], p: GrpoParameters, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> float:
    return float(_terms(x, p, budget_bytes).loss.sum())


def chunked_gradient(x: Mapping[str, torch.Tensor], p: GrpoParameters,
                     budget_bytes: int = DEFAULT_BUDGET_BYTES,
                     logp_error: torch.Tensor | None = None) -> Iterator[GradientChunk]:
    """`logp_error` [B, S]: bounds of an implementation's log-prob errors; with it every chunk also
    carries each row's coefficient and the bounds of how far it and the row's loss term move
    (`token_terms`)."""
    logits, ids = x["logits"], x["completion_ids"]
    batch, seq_next, vocab = logits.shape
    terms = _terms(x, p, budget_bytes, logp_error)
    coef, row_scale = terms.dlogp / p.temperature, terms.scale / p.temperature
    extra = logp_error is not None
    if extra:
        coef_err, loss_err = terms.coef_error / p.temperature, terms.loss_error
    for start, stop in chunk_bounds(batch, seq_next, vocab, budget_bytes):
        z, b, t, valid, target = _rows(logits, ids, start, stop)
        grad = torch.zeros_like(z)
        scale = torch.zeros(stop - start, dtype=torch.float64, device=logits.device)
        rows = [torch.zeros_like(scale) for _ in range(3)] if extra else None
        if bool(valid.any()):
            bv, tv = b[valid], t[valid]
            c = coef[bv, tv]
            scaled = z[valid] / p.temperature
            g = -torch.softmax(scaled, dim=-1)
            g.scatter_add_(-1, target[valid].unsqueeze(-1), torch.ones_like(g[:, :1]))
            grad[valid] = g * c.unsqueeze(-1)
            scale[valid] = row_scale[bv, tv]
            if extra:
                for out, grid in zip(rows, (coef, coef_err, loss_err)):
                    out[valid] = grid[bv, tv]
        yield GradientChunk(start, stop, grad, scale, *(rows or ()))


def loss_logprob_error(x: Mapping[str, torch.Tensor], p: GrpoParameters, logp_error: torch.Tensor,
                       budget_bytes: int = DEFAULT_BUDGET_BYTES) -> float:
    """Bound of how far the loss moves when every logp[b, t] is off by at most logp_error[b, t]
    (`token_terms`; 0 without log-probs)."""
    return float(_terms(x, p, budget_bytes, logp_error).loss_error.sum())


def _mapping(first, rest) -> tuple[Mapping[str, torch.Tensor], GrpoParameters]:
    """(x, p) from the new call (x, p) or the pre-family call (logits, completion_ids, advantages, params)."""
    if isinstance(first, Mapping):
        return first, rest[0]
    ids, adv, params = rest
    return {"logits": first, "completion_ids": ids, "advantages": adv}, params


def reference_loss(x, p, *legacy) -> float:
    """The reduced loss in float64. `reference_loss(x, p)`; legacy: `(logits, completion_ids, advantages, params)`."""
    x, p = _mapping(x, (p, *legacy))
    return chunked_loss(x, p)


def reference_gradient(x, p, *legacy, logp_error: torch.Tensor | None = None) -> Iterator[GradientChunk]:
    """The float64 gradient d loss / d logits, chunk by chunk over the flattened rows (`logp_error`:
    see `chunked_gradient`)."""
    x, p = _mapping(x, (p, *legacy))
    return chunked_gradient(x, p, logp_error=logp_error)


def row_scales(x, p, *legacy) -> torch.Tensor:
    """Per flattened logits row, |dL/dlogp| / T (0 on the last position and masked rows).
    `row_scales(x, p, seq_next)`; legacy: `row_scales(advantages, seq_next, params)` (on-policy)."""
    if isinstance(x, Mapping):
        seq_next = legacy[0] if legacy else x["logits"].shape[1]
        params = p
    else:
        adv, seq_next, params = x, p, legacy[0]
        x = {"advantages": adv, "completion_ids": torch.zeros(adv.numel(), seq_next - 1, dtype=torch.int64, device=adv.device)}
    coef = _terms(x, params, DEFAULT_BUDGET_BYTES).scale / params.temperature
    batch = coef.shape[0]
    out = torch.zeros(batch, seq_next, dtype=torch.float64, device=coef.device)
    out[:, : seq_next - 1] = coef
    return out.reshape(-1)


def reference_gradient_dense(x, p, *legacy) -> torch.Tensor:
    """The whole float64 gradient as one tensor (small inputs and tests only)."""
    x, p = _mapping(x, (p, *legacy))
    logits = x["logits"]
    out = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    flat = out.view(-1, logits.shape[-1])
    for chunk in chunked_gradient(x, p):
        flat[chunk.start : chunk.stop] = chunk.values
    return out
