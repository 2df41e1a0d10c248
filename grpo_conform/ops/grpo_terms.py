"""The GRPO terms on the [batch, seq] grid, shared by every operation that feeds them log-probs (issue 30).

Given the float64 log-probs logp [B, S] of the sampled tokens (however an operation computes them:
from given logits, or from hidden states times an lm_head weight), `token_terms` gives the closed-form
weighted per-token loss and dL/dlogp: the importance ratio (token or sequence level), the clip branch
(and dual clip), CISPO's weight, the vLLM sampling-ratio correction, the k3 KL term and the loss
type's normaliser (`token_weights`). An operation then chains dL/dlogp into the gradients of its own
inputs. Moved unchanged from the logits reference (grpo_conform/ops/grpo_logits/reference.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

import torch


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
    # TRL 1.16 defaults (issue 33): the KL term times the ratio, the vLLM correction's mode, and
    # TRL's dapo normaliser max(1, N) / P * gradient_accumulation_steps / steps_per_generation
    # (given with the two step counts; without them dapo_global's max(1, N / P)).
    use_bias_correction_kl: bool = False
    vllm_importance_sampling_mode: str = "token_truncate"
    gradient_accumulation_steps: Optional[int] = None
    steps_per_generation: Optional[int] = None
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
        if "use_bias_correction_kl" in kw:
            kw["use_bias_correction_kl"] = bool(kw["use_bias_correction_kl"])
        return cls(**kw)

    @classmethod
    def from_spec(cls, spec: Any, values: Mapping[str, Any] | None = None) -> "GrpoParameters":
        """The spec's declared defaults, overridden by `values` (drawn ones); undeclared terms are off."""
        merged = dict(spec.parameter_values)
        merged.update({k: v for k, v in (values or {}).items() if k in merged})
        return cls.from_mapping(merged)

    @property
    def ratio_over_sequence(self) -> bool:
        """Whether the ratio is taken over each sequence's kept tokens rather than per token: GSPO's
        (importance_sampling_level "sequence": the mean log-ratio) and VESPO's (a weight of the summed log-ratio)."""
        return self.importance_sampling_level == "sequence" or self.loss_type == "vespo"



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
    if lt in ("dapo", "cispo", "vespo") and p.num_items_in_batch is not None and p.gradient_accumulation_steps is not None:
        # TRL 1.16 (_compute_loss): num_items_in_batch.clamp(min=1) / num_processes * gas / steps_per_generation
        return mf / trl_dapo_normaliser(p)
    if lt in ("dapo", "cispo", "vespo") and p.num_items_in_batch is not None:
        return mf / max(1.0, float(p.num_items_in_batch) / float(p.num_processes or 1))
    if lt in ("bnpo", "dapo", "cispo", "vespo"):
        return mf / max(1.0, float(mf.sum()))
    raise ValueError(f"loss_type {p.loss_type!r} has no reference (expected grpo, bnpo, dr_grpo, dapo, cispo, sapo, "
                     "luspo, vespo)")


def trl_dapo_normaliser(p: GrpoParameters) -> float:
    """TRL 1.16's dapo/cispo normaliser in training: max(1, N) / P * gas / steps_per_generation."""
    steps = p.steps_per_generation if p.steps_per_generation is not None else p.gradient_accumulation_steps
    return (max(1.0, float(p.num_items_in_batch)) / float(p.num_processes or 1)
            * float(p.gradient_accumulation_steps) / float(steps))


def vllm_weights(x: Mapping[str, torch.Tensor], m: torch.Tensor, p: GrpoParameters) -> torch.Tensor:
    """rho[b, t] of the vLLM correction (0 on masked tokens), TRL 1.16's four modes
    (`_generate_and_score_completions`): sampling_ratio = exp(old - sampling log-probs) per token;
    sequence modes use exp(sum over the unmasked tokens of log sampling_ratio) for every token of the
    sequence; truncate clamps at the cap, mask zeroes a ratio above it (a ratio equal to it is kept)."""
    rho = x["sampling_ratio"].to(torch.float64)
    mode = p.vllm_importance_sampling_mode
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise ValueError(f"vllm_importance_sampling_mode {mode!r}: expected token_truncate, token_mask, "
                         "sequence_truncate or sequence_mask")
    if mode.startswith("sequence"):
        log_rho = torch.where(m, torch.log(rho), torch.zeros_like(rho))
        rho = torch.exp(log_rho.sum(-1, keepdim=True)).expand_as(rho)
    if p.sampling_ratio_cap is not None:
        if mode.endswith("mask"):
            rho = torch.where(rho > p.sampling_ratio_cap, torch.zeros_like(rho), rho)
        else:
            rho = rho.clamp(max=p.sampling_ratio_cap)
    return torch.where(m, rho, torch.zeros_like(rho))


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
        rho = vllm_weights(x, m, p)
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
        k3 = torch.exp(d) - d - 1.0
        if p.use_bias_correction_kl:
            # TRL 1.16: per_token_kl * coef_1, coef_1 = exp(log importance weight) before any clip and
            # not detached: d(k3 r)/dlogp = r (1 - e^d) + k3 dr/dlogp. At token level dr/dlogp = r, so
            # the sum is -r d; at sequence level r = s_b couples the sequence (as the policy term).
            loss = loss + p.beta * k3 * r
            direct = w * p.beta * r * (1.0 - torch.exp(d))
            via = w * p.beta * k3
            via = via.sum(-1, keepdim=True) * r * mf / n if sequence else via * r
            dlogp = dlogp + direct + via
            scale = scale + w * abs(p.beta) * r * (1.0 + torch.exp(d) + k3) + via.abs()
            if moves and not sequence:  # the derivative is -w beta r d: r moves by r g, d by e
                coef_error = coef_error + w * abs(p.beta) * r * (g * d.abs() + (1.0 + g) * e)
            elif moves:  # r moves by r g, k3 by e^d expm1(e) + e, (1 - e^d) by e^d expm1(e)
                coef_error = coef_error + (w * abs(p.beta) * r * ((1.0 + g) * torch.exp(d) * torch.expm1(e)
                                                                   + g * (1.0 + torch.exp(d)))
                                           + via.abs() * g + w * abs(p.beta) * r * (1.0 + g)
                                           * (torch.exp(d) * torch.expm1(e) + e))
            if moves:
                loss_error = loss_error + w * abs(p.beta) * r * ((1.0 + g) * (torch.exp(d) * torch.expm1(e) + e)
                                                                 + k3 * g)
        else:
            loss = loss + p.beta * k3
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
VESPO_TOKEN_CLAMP = 20.0


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
    raw = (log_ratio.clamp(-VESPO_TOKEN_CLAMP, VESPO_TOKEN_CLAMP) * mf).sum(-1, keepdim=True)
    k, lam = _vespo_shape(A, p)
    return _phi(raw.clamp(_VESPO_LOW, 20.0), k, lam).expand_as(log_ratio)


def _vespo_weight_error(log_ratio, mf, A, p: GrpoParameters, err_sum, phi):
    """How far phi_b moves when the sequence's log-ratio sum moves by at most err_sum (both clamps are
    monotone and 1-Lipschitz, so the clamped sum stays in [clamp(s - E), clamp(s + E)]): phi is
    unimodal in u (peak at log(k / lambda)), so its ends and the peak bound it."""
    raw = (log_ratio.clamp(-VESPO_TOKEN_CLAMP, VESPO_TOKEN_CLAMP) * mf).sum(-1, keepdim=True)
    k, lam = _vespo_shape(A, p)
    lo, hi = (raw - err_sum).clamp(_VESPO_LOW, 20.0), (raw + err_sum).clamp(_VESPO_LOW, 20.0)
    peak = torch.log(k.clamp_min(1e-300) / lam).clamp(min=lo, max=hi)
    base = phi[:, :1]
    out = torch.zeros_like(base)
    for u in (lo, hi, peak):
        out = torch.maximum(out, (_phi(u, k, lam) - base).abs())
    return out.expand_as(phi)
