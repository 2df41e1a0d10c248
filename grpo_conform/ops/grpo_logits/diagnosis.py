"""Which neighbouring semantics a failing implementation computes (issue 35 item 3).

When a call's loss or gradient misses the reference, the validator evaluates the variants the
family knows on that call's own inputs, in float64: other normalisers (grpo, bnpo, dr_grpo,
dapo as Liger and we compute it, dapo as TRL 1.16 computes it), the KL term as k1, without
beta, with beta fixed, with TRL's bias correction (times the ratio); no clip, verl's dual clip;
the ratio detached; the mask ignored or used only inside the exponent; temperature ignored or
its 1/T chain-rule factor missing; the ratio at the other level (token vs sequence); the vLLM
correction ignored, untruncated or in TRL's other modes; the other loss types. A variant that
equals the implementation's outputs within the check's own allowances is named in the failure
(`likely cause`). Nothing here runs for a passing call.

A variant is a `Semantics` (the changes from the member, every field None = as the member) in
the plain dict `VARIANTS`. Variants are computed on the [B, S] grid with autograd (dL/dlogp),
then spread over the logits rows as dL/dlogp / T * (onehot - softmax(z / T)), chunk by chunk:
one pass over the logits per temperature, whatever the number of variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional

import torch

from grpo_conform.ops.grpo_logits.reference import GrpoParameters, chunk_bounds, reference_logprobs
from grpo_conform.ops.grpo_terms import mask_of, vespo_weight

TRL_FORMER_BETA = 0.04  # Liger-Kernel 0.8.5's default beta (LigerFusedLinearGRPOLoss), TRL's before 0.19


@dataclass(frozen=True)
class Semantics:
    """How a variant differs from the member; None keeps the member's choice."""

    objective: Optional[str] = None  # "clip" | "cispo"
    # grpo | bnpo | dr_grpo | dapo_trl | dapo_global | all_positions | dapo_trl_no_factor
    normaliser: Optional[str] = None
    clip: Optional[str] = None  # "none" (ratio never clipped) | "dual3" (verl's dual clip, clip_ratio_c = 3)
    delta_as_dual_clip: bool = False  # verl's dual clip with clip_ratio_c = delta instead of min(r, delta)
    ratio_detached: bool = False  # the ratio carries no gradient (exp(logp - logp), or r.detach())
    kl: Optional[str] = None  # "k1" | "none" | "bias_corrected" (k3 times the ratio, TRL 1.16's default) | "k3"
    beta: Optional[float] = None
    mask: Optional[str] = None  # "ignored" | "ratio_only" (exp((logp - old) m), reduction unmasked)
    temperature: Optional[str] = None  # "ignored" (logits not divided) | "no_chain_factor" (gradient times T)
    level: Optional[str] = None  # "token" | "sequence"
    # "ignored" | "untruncated" | "token_truncate" | "token_mask" | "sequence_truncate" | "sequence_mask"
    vllm: Optional[str] = None


@dataclass(frozen=True)
class Variant:
    describes: str  # completes "your outputs equal the reference with ..."
    semantics: Semantics
    applies: Callable[[Mapping[str, torch.Tensor], GrpoParameters], bool] = lambda x, p: True


def _off_policy(x, p):
    return "old_logprobs" in x


def _kl(x, p):
    return "ref_logprobs" in x and p.beta != 0.0


def _clip(x, p):
    return p.loss_type not in ("cispo", "sapo", "vespo")


def _not(loss_type):
    return lambda x, p: p.loss_type.replace("-", "_") != loss_type


def _normaliser_differs(name):
    return lambda x, p: _clip(x, p) and _normaliser(p) != name


def _vllm_other(mode):
    return lambda x, p: "sampling_ratio" in x and p.vllm_importance_sampling_mode != mode


def _normaliser(p: GrpoParameters) -> str:
    lt = p.loss_type.replace("-", "_")
    if lt in ("dapo", "cispo", "vespo"):
        if p.num_items_in_batch is not None and p.gradient_accumulation_steps is not None:
            return "dapo_trl"  # issue 33's dapo-global-accum-mask
        return "dapo_global" if p.num_items_in_batch is not None else "bnpo"
    return "grpo" if lt == "sapo" else lt


VARIANTS: dict[str, Variant] = {
    "normaliser-grpo": Variant("per-sequence normalisation (grpo: each sequence's mean, then the batch's)",
                               Semantics(normaliser="grpo"), _normaliser_differs("grpo")),
    "normaliser-bnpo": Variant("this batch's token count as normaliser (bnpo, dapo on one process)",
                               Semantics(normaliser="bnpo"), _normaliser_differs("bnpo")),
    "normaliser-dr-grpo": Variant("the constant normaliser B * max_completion_length (dr_grpo)",
                                  Semantics(normaliser="dr_grpo"), _normaliser_differs("dr_grpo")),
    "normaliser-dapo-trl": Variant("TRL 1.16's dapo normaliser max(1, num_items_in_batch) / num_processes",
                                   Semantics(normaliser="dapo_trl"),
                                   lambda x, p: p.num_items_in_batch is not None and _normaliser(p) != "dapo_trl"),
    "normaliser-dapo-global": Variant("the dapo normaliser clamped after the division, max(1, num_items_in_batch / "
                                      "num_processes) (Liger's), not TRL's max(1, num_items_in_batch) / num_processes",
                                      Semantics(normaliser="dapo_global"),
                                      lambda x, p: p.num_items_in_batch is not None and _normaliser(p) != "dapo_global"),
    "accumulation-factor-ignored": Variant("TRL's dapo normaliser without its gradient_accumulation_steps / "
                                           "steps_per_generation factor", Semantics(normaliser="dapo_trl_no_factor"),
                                           lambda x, p: p.gradient_accumulation_steps is not None),
    "normaliser-all-positions": Variant("the masked sum divided by every position, B * S (a plain mean over padding)",
                                        Semantics(normaliser="all_positions"), lambda x, p: "completion_mask" in x),
    "loss-type-grpo": Variant("loss_type grpo (the clipped surrogate, per-sequence normalisation)",
                              Semantics(objective="clip", normaliser="grpo"), lambda x, p: p.loss_type == "cispo"),
    "loss-type-dapo": Variant("loss_type dapo (the clipped surrogate, the token-count normaliser)",
                              Semantics(objective="clip"), lambda x, p: p.loss_type == "cispo"),
    "loss-type-cispo": Variant("loss_type cispo (the detached capped ratio times log-probs)",
                               Semantics(objective="cispo"), lambda x, p: _off_policy(x, p) and _clip(x, p)),
    "clip-ignored": Variant("the ratio never clipped (epsilon has no effect)", Semantics(clip="none"),
                            lambda x, p: _off_policy(x, p) and _clip(x, p)),
    "dual-clip-3": Variant("PPO's dual clip at 3 added for negative advantages (verl's default clip_ratio_c)",
                           Semantics(clip="dual3"), lambda x, p: _off_policy(x, p) and _clip(x, p)),
    "delta-as-dual-clip": Variant("verl's dual clip with clip_ratio_c = delta instead of the two-sided min(r, delta)",
                                  Semantics(delta_as_dual_clip=True), lambda x, p: p.delta is not None),
    "delta-ignored": Variant("delta ignored (the one-sided clip)", Semantics(clip="no_delta"),
                             lambda x, p: p.delta is not None),
    "ratio-detached": Variant("a ratio that carries no gradient (old log-probs = logp not detached, or the ratio "
                              "detached)", Semantics(ratio_detached=True), _clip),
    "kl-k1": Variant("the k1 KL estimator logp - ref instead of k3", Semantics(kl="k1"), _kl),
    "kl-omitted": Variant("no KL term", Semantics(kl="none"), _kl),
    "kl-beta-0.04": Variant(f"beta fixed at {TRL_FORMER_BETA} (Liger-Kernel's default) whatever is passed",
                            Semantics(beta=TRL_FORMER_BETA), lambda x, p: _kl(x, p) and p.beta != TRL_FORMER_BETA),
    "kl-bias-corrected": Variant("the KL term multiplied by the ratio (TRL 1.16's default use_bias_correction_kl=True)",
                                 Semantics(kl="bias_corrected"), lambda x, p: _kl(x, p) and not p.use_bias_correction_kl),
    "kl-not-bias-corrected": Variant("the KL term not multiplied by the ratio (TRL's use_bias_correction_kl=False)",
                                     Semantics(kl="k3"), lambda x, p: _kl(x, p) and p.use_bias_correction_kl),
    "mask-ignored": Variant("the completion mask ignored (padding counts as tokens)", Semantics(mask="ignored"),
                            lambda x, p: "completion_mask" in x),
    "mask-in-ratio-only": Variant("the mask applied inside exp only (exp((logp - old) * m)), not in the reduction",
                                  Semantics(mask="ratio_only"), lambda x, p: "completion_mask" in x),
    "temperature-ignored": Variant("the logits not divided by the temperature", Semantics(temperature="ignored"),
                                   lambda x, p: p.temperature != 1.0),
    "temperature-no-chain-factor": Variant("the 1/T chain-rule factor missing from the gradient",
                                           Semantics(temperature="no_chain_factor"), lambda x, p: p.temperature != 1.0),
    "sequence-ratio": Variant("the sequence-level (GSPO) ratio instead of the token-level one",
                              Semantics(level="sequence"),
                              lambda x, p: _off_policy(x, p) and _clip(x, p)
                              and p.importance_sampling_level == "token"),
    "token-ratio": Variant("the token-level ratio instead of the sequence-level (GSPO) one", Semantics(level="token"),
                           lambda x, p: _off_policy(x, p) and p.importance_sampling_level == "sequence"),
    "vllm-ignored": Variant("the vLLM importance-sampling correction never applied", Semantics(vllm="ignored"),
                            lambda x, p: "sampling_ratio" in x),
    "vllm-untruncated": Variant("the vLLM sampling ratio not truncated at its cap", Semantics(vllm="untruncated"),
                                lambda x, p: "sampling_ratio" in x and p.sampling_ratio_cap is not None),
    "vllm-token-mask": Variant("TRL's vllm_importance_sampling_mode token_mask (ratios above the cap zeroed)",
                               Semantics(vllm="token_mask"), _vllm_other("token_mask")),
    "vllm-sequence-truncate": Variant("TRL's vllm_importance_sampling_mode sequence_truncate",
                                      Semantics(vllm="sequence_truncate"), _vllm_other("sequence_truncate")),
    "vllm-sequence-mask": Variant("TRL's vllm_importance_sampling_mode sequence_mask (TRL 1.16's default)",
                                  Semantics(vllm="sequence_mask"), _vllm_other("sequence_mask")),
    "vllm-token-truncate": Variant("TRL's vllm_importance_sampling_mode token_truncate (per-token ratios clamped at "
                                   "the cap)", Semantics(vllm="token_truncate"), _vllm_other("token_truncate")),
}


@torch.enable_grad()
def variant_grid(x: Mapping[str, torch.Tensor], p: GrpoParameters, logp: torch.Tensor,
                 s: Semantics) -> tuple[float, torch.Tensor]:
    """(loss, dL/dlogp [B, S]) of the semantics `s` in float64, by autograd on the [B, S] grid.
    `logp`: float64 log-probs at the temperature the variant uses (every t < S, masked ones too)."""
    batch, seq = x["completion_ids"].shape
    device = logp.device
    lp = logp.detach().clone().requires_grad_(True)
    true_mask = mask_of(x, (batch, seq), device)
    m = torch.ones_like(true_mask) if s.mask in ("ignored", "ratio_only") else true_mask
    mf = m.to(torch.float64)
    adv = x["advantages"].to(torch.float64).reshape(batch, 1).expand(batch, seq)
    ratio_lp = lp.detach() if s.ratio_detached else lp
    old = x["old_logprobs"].to(torch.float64) if "old_logprobs" in x else lp.detach()
    keep = true_mask if s.mask == "ratio_only" else m
    log_ratio = torch.where(keep, ratio_lp - old, torch.zeros_like(lp))
    level = s.level or p.importance_sampling_level
    if level == "sequence":
        n = mf.sum(-1, keepdim=True).clamp_min(1.0)
        r = torch.exp((log_ratio * mf).sum(-1, keepdim=True) / n).expand(batch, seq)
    else:
        r = torch.exp(log_ratio)
    objective = s.objective or (p.loss_type if p.loss_type in ("cispo", "sapo", "vespo") else "clip")
    if objective == "sapo":
        tau = torch.where(adv > 0, torch.full_like(adv, p.sapo_temperature_pos), torch.full_like(adv, p.sapo_temperature_neg))
        term = -(4.0 / tau) * torch.sigmoid(tau * (r - 1.0)) * adv
    elif objective == "vespo":
        term = -vespo_weight(log_ratio.detach(), m.to(torch.float64), adv, p) * adv * lp
    elif objective == "cispo":
        term = -r.clamp(max=p.epsilon_high).detach() * adv * lp
    else:
        lo, hi = 1.0 - p.epsilon_low, 1.0 + p.epsilon_high
        c2 = r if s.clip == "none" else r.clamp(lo, hi)
        use_delta = p.delta is not None and s.clip != "no_delta" and not s.delta_as_dual_clip
        c1 = r.clamp(max=p.delta) if use_delta else r
        term = -torch.min(c1 * adv, c2 * adv)  # min splits ties, clamp passes at its bounds: the tie rule
        dual = 3.0 if s.clip == "dual3" else (p.delta if s.delta_as_dual_clip else None)
        if dual is not None:
            term = torch.where(adv < 0, torch.min(-adv * dual, term), term)
    if "sampling_ratio" in x and s.vllm != "ignored":
        mode = s.vllm or p.vllm_importance_sampling_mode
        term = term * _vllm_weight(x["sampling_ratio"].to(torch.float64), m, p.sampling_ratio_cap, mode)
    beta = p.beta if s.beta is None else s.beta
    if "ref_logprobs" in x and beta != 0.0 and s.kl != "none":
        d = x["ref_logprobs"].to(torch.float64) - lp
        kl = -d if s.kl == "k1" else torch.exp(d) - d - 1.0
        if s.kl == "bias_corrected" or (s.kl is None and p.use_bias_correction_kl):
            kl = kl * r  # TRL's per_token_kl * coef_1: the ratio before any clip, with its gradient
        term = term + beta * kl
    w = _weights(m, p, s.normaliser or _normaliser(p), seq)
    loss = torch.where(w != 0, w * term, torch.zeros_like(term)).sum()
    dlogp = None
    if loss.requires_grad:  # a variant may not depend on logp at all (a detached ratio, no KL)
        (dlogp,) = torch.autograd.grad(loss, lp, allow_unused=True)
    dlogp = torch.zeros_like(lp) if dlogp is None else dlogp
    if s.temperature == "no_chain_factor":
        dlogp = dlogp * p.temperature
    return float(loss.detach()), dlogp.detach()


def _vllm_weight(ratio, mask, cap, mode):
    cap = math.inf if cap is None else cap
    if mode in ("sequence_truncate", "sequence_mask"):  # TRL: exp of the masked sum of per-token log ratios
        ratio = torch.exp((torch.log(ratio) * mask).sum(-1, keepdim=True)).expand_as(ratio)
    if mode in ("token_mask", "sequence_mask"):
        return torch.where(ratio > cap, torch.zeros_like(ratio), ratio)
    return ratio if mode == "untruncated" else ratio.clamp(max=cap)


def _weights(m, p, normaliser, seq):
    mf = m.to(torch.float64)
    batch = m.shape[0]
    if normaliser == "grpo":
        return mf / (batch * mf.sum(-1, keepdim=True).clamp_min(1.0))
    if normaliser == "luspo":
        return mf / batch
    if normaliser == "dr_grpo":
        return mf / (batch * (p.max_completion_length or max(1, seq)))
    if normaliser == "all_positions":
        return mf / (batch * max(1, seq))
    if normaliser in ("dapo_trl", "dapo_global", "dapo_trl_no_factor") and p.num_items_in_batch is not None:
        items, procs = float(p.num_items_in_batch), float(p.num_processes or 1)
        factor = 1.0  # TRL's accumulation factor where the member has one (dapo-global-accum-mask)
        if normaliser != "dapo_trl_no_factor" and p.gradient_accumulation_steps is not None:
            factor = p.gradient_accumulation_steps / (p.steps_per_generation or p.gradient_accumulation_steps)
        if normaliser == "dapo_global":
            return mf / (max(1.0, items / procs) * factor)
        return mf / (max(1.0, items) / procs * factor)
    return mf / max(1.0, float(mf.sum()))  # bnpo; dapo of this batch


@dataclass(frozen=True)
class VariantMatch:
    name: str
    describes: str
    loss_error: float  # |loss - the variant's loss|
    gradient_error: float  # ||gradient - the variant's|| / ||the variant's|| (absolute when that is 0)

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.name, "describes": self.describes, "loss_abs_error": self.loss_error,
                "gradient_rel_error": self.gradient_error}


@dataclass(frozen=True)
class Diagnosis:
    matches: tuple[VariantMatch, ...]  # best first
    evaluated: tuple[str, ...]  # variants distinguishable from the reference on these inputs

    @property
    def sentence(self) -> str:
        if not self.matches:
            return (f"none of the {len(self.evaluated)} neighbouring semantics evaluated on this call's inputs "
                    "matches the outputs")
        best = self.matches[0]
        also = f" (also matching: {', '.join(m.name for m in self.matches[1:])})" if self.matches[1:] else ""
        return (f"your outputs equal the reference with {best.describes} [{best.name}]: loss within "
                f"{best.loss_error:.2g}, gradient within {best.gradient_error:.2g} relative{also}")

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.sentence, "matches": [m.to_json() for m in self.matches],
                "variants_evaluated": list(self.evaluated)}


def diagnose(x: Mapping[str, torch.Tensor], p: GrpoParameters, loss: float, grad: torch.Tensor,
             loss_allowed: float, gradient_allowed: float, upstream: float = 1.0,
             names: tuple[str, ...] | None = None) -> Diagnosis:
    """Which variants of `VARIANTS` (or `names`) the outputs equal: the loss within `loss_allowed`
    (absolute) and the gradient within `gradient_allowed` (relative Frobenius), the check's own
    allowances. `upstream`: the scalar the gradient was taken with (the loss is never scaled).
    A variant the reference itself equals within those allowances on these inputs is not evaluated:
    it cannot be told apart here (bnpo and dapo on one process, a normaliser on equal lengths)."""
    chosen = {n: v for n, v in VARIANTS.items() if (names is None or n in names) and v.applies(x, p)}
    logits = x["logits"]
    batch, seq_next, vocab = logits.shape
    temps = {p.temperature}
    if any(v.semantics.temperature == "ignored" for v in chosen.values()):
        temps.add(1.0)
    logps = {t: reference_logprobs(x, replace(p, temperature=t)) for t in temps}
    grids: dict[str, tuple[float, float, torch.Tensor]] = {}  # name -> (loss, T used, dL/dlogp)
    ref_loss, ref_dlogp = variant_grid(x, p, logps[p.temperature], Semantics())
    grids[""] = (ref_loss, p.temperature, ref_dlogp)
    for name, v in chosen.items():
        t = 1.0 if v.semantics.temperature == "ignored" else p.temperature
        lv, dv = variant_grid(x, p, logps[t], v.semantics)
        grids[name] = (lv, t, dv)
    sq = _squared_distances(logits, x["completion_ids"], grad, grids, upstream)
    ref_norm = math.sqrt(sq[""][1])
    evaluated, matches = [], []
    for name, v in chosen.items():
        lv = grids[name][0]
        diff_impl, norm_v, diff_ref = sq[name]
        scale = max(math.sqrt(norm_v), ref_norm)
        if abs(lv - ref_loss) <= loss_allowed and math.sqrt(diff_ref) <= gradient_allowed * max(scale, 1e-300):
            continue  # the reference itself equals this variant here
        evaluated.append(name)
        g_err = math.sqrt(diff_impl) / scale if scale > 0 else math.sqrt(diff_impl)
        l_err = abs(loss - lv)
        # the check's loss allowance is sized for the reference's magnitude: a variant far larger (a
        # normaliser of 21,205 tokens against this batch's 20) carries float32 rounding in proportion to
        # its own value (gallery micro-batch-normaliser went unnamed in 2 of 25 runs)
        l_allowed = loss_allowed * max(1.0, abs(lv) / max(abs(ref_loss), 1e-300))
        if l_err <= l_allowed and g_err <= gradient_allowed:
            matches.append((max(l_err / max(l_allowed, 1e-300), g_err / max(gradient_allowed, 1e-300)),
                            VariantMatch(name, v.describes, l_err, g_err)))
    matches.sort(key=lambda m: m[0])
    return Diagnosis(tuple(m for _, m in matches), tuple(evaluated))


def _squared_distances(logits, ids, grad, grids, upstream):
    """Per variant: (||grad - g_v||^2, ||g_v||^2, ||g_ref - g_v||^2) over the whole gradient, where
    g_v = upstream * dL/dlogp / T * (onehot - softmax(z / T)) on rows t < S and 0 on the last row."""
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    flat_z, flat_g = logits.reshape(-1, vocab), grad.reshape(-1, vocab)
    out = {name: [0.0, 0.0, 0.0] for name in grids}
    ref_t = grids[""][1]
    for start, stop in chunk_bounds(batch, seq_next, vocab):
        rows = torch.arange(start, stop, device=logits.device)
        b, t = rows // seq_next, rows % seq_next
        valid = t < seq
        g = flat_g[start:stop].to(torch.float64)
        rest = float(g[~valid].pow(2).sum())  # the last row: every variant's is 0
        for acc in out.values():
            acc[0] += rest
        if not bool(valid.any()):
            continue
        g, z, bv, tv = g[valid], flat_z[start:stop][valid].to(torch.float64), b[valid], t[valid]
        idx = ids[bv, tv].to(torch.int64).unsqueeze(-1)
        bases = {}
        for temp in {v[1] for v in grids.values()}:
            base = -torch.softmax(z / temp, dim=-1)
            base.scatter_add_(-1, idx, torch.ones_like(base[:, :1]))
            bases[temp] = base / temp
        g_ref = bases[ref_t] * (upstream * grids[""][2][bv, tv]).unsqueeze(-1)
        for name, (_loss, temp, dlogp) in grids.items():
            gv = g_ref if name == "" else bases[temp] * (upstream * dlogp[bv, tv]).unsqueeze(-1)
            acc = out[name]
            acc[0] += float((g - gv).pow(2).sum())
            acc[1] += float(gv.pow(2).sum())
            acc[2] += float((g_ref - gv).pow(2).sum())
    return out
