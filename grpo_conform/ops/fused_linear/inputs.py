"""Seeded inputs of grpo-fused-linear, for a resolved workload.

Layout, as trainers pass it (Liger's `_input`, TRL's Liger path): `hidden` [B, T, H] is aligned with
`completion_ids` [B, T]: hidden[b, t] is the state that predicts completion token t. From a causal
model's last hidden states `out` [B, P + T, H] over prompt (P tokens) + completion, that is
`out[:, P - 1 : P + T - 1, :]` (the state at position i scores token i + 1, so the last position is
dropped and the prompt's last state predicts the first completion token); logits would be
`hidden @ weight.T + bias`, the lm_head. No position is left over, unlike the logits operation's
`seq + 1` positions.

Values, chosen so the logits have a realistic spread without materialising them:
- weight [V, H] ~ N(0, 1/H), so a hidden row of unit RMS gives logits of std ~1;
- hidden rows get the spec's validation profiles (the same names as the logits operation's), read as
  what they do to that row's logits: `scale` is the logits' std (hidden ~ N(0, scale^2); student_t
  rows are heavy-tailed along H; `clamp` clamps hidden), `peaked` adds `spike` to the target logit
  (hidden += spike * weight[c] / |weight[c]|^2, computed on the rounded weight);
- bias ~ N(0, 1); `ref_hidden` is the policy's hidden plus N(0, 0.5^2) per element (every reference
  logit moves by ~N(0, 0.25) whatever the row's scale: ref - logp stays where exp() is finite in fp32,
  also on the adversarial rows), `ref_weight` / `ref_bias` the policy's plus 0.1% relative noise (of
  the drawn std: 1/sqrt(H), 1);
- where: the large tensors (weight, hidden, bias, ref_weight, ref_hidden, ref_bias) are drawn on their
  own device, in seeded row blocks (`draws`: CUDA generators for a CUDA workload, nothing drawn on the
  host or copied over PCIe; CPU generators over torch's threads for a CPU one), a function of (seed,
  device); the [B, T] grids below with CPU generators, the same on every device;
- advantages, completion ids and the mask: the logits operation's generators; old log-probs:
  logp - log r with r drawn across the clip regions from the float64 log-probs of the rounded
  inputs (as the logits operation draws them); given ref log-probs: logp + sign(A) * U[gap].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import torch

from grpo_conform.dtypes import torch_dtype
from grpo_conform.ops.fused_linear import draws
from grpo_conform.ops.fused_linear.reference import generated_row_stats
from grpo_conform.ops.fused_linear.row_pass import RowPass
from grpo_conform.ops.grpo_logits.generators import advantages, token_ids
from grpo_conform.ops.grpo_logits.generators import spread_peaks as spread_peaks_
from grpo_conform.ops.grpo_logits.generators.masks import classify
from grpo_conform.ops.grpo_logits.member_inputs import (
    HostDraws, check_given, fill_completion_mask, old_logprobs_for,
)
from grpo_conform.ops.grpo_terms import GrpoParameters

_SALT = 0x66757365  # separates the member inputs' draws from the hidden/weight stream of the same seed
REF_NOISE = 1e-3  # relative, on ref_weight / ref_bias: a 'large' row (logits ~1e3) moves by ~1
REF_HIDDEN_NOISE = 0.5  # absolute, on ref_hidden: with weight ~ N(0, 1/H) every logit moves by ~N(0, 0.25)


@dataclass(frozen=True)
class Inputs:
    tensors: dict[str, torch.Tensor]
    seed: int
    profiles: tuple[str, ...]
    covered: dict[str, list[str]] = field(default_factory=dict)
    # the row pass the generator made of these values (members with old or reference log-probs; None
    # otherwise), at `rows_temperature`: the engine keeps it for the judge where the generator wrote into
    # parent-owned tensors (`GrpoFusedLinear.keep_generated`)
    rows: Optional[RowPass] = None
    rows_temperature: float = 1.0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def allocate(spec: Any, resolved: Any, device) -> dict[str, torch.Tensor]:
    out = {}
    for t in spec.inputs:
        dtype = torch_dtype(resolved.dtypes.get(t.name, t.dtypes[0]))
        out[t.name] = torch.empty(resolved.shapes[t.name], dtype=dtype, device=device)
    return out


def _profiled_hidden(n: int, hidden: int, profiles: Sequence[Any], gen: torch.Generator, seed: int,
                     device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 hidden rows [n, H] on `device` (drawn there: `draws`) and each row's profile index (CPU)."""
    which = torch.randperm(n, generator=gen) % len(profiles)
    out = torch.empty(n, hidden, device=device)
    for k, prof in enumerate(profiles):
        rows = torch.nonzero(which == k).squeeze(-1)
        if rows.numel() == 0:
            continue
        x = draws.normal((rows.numel(), hidden), seed, (draws.HIDDEN, k), device)
        if prof.kind == "student_t":
            df = max(1, round(prof.df))
            chi2 = sum(draws.normal((rows.numel(), hidden), seed, (draws.CHI2, k, j), device) ** 2 for j in range(df))
            x = x / torch.sqrt(chi2 / df).clamp_min(1e-6)
        x = x * prof.scale
        if prof.clamp is not None:
            x = x.clamp(-prof.clamp, prof.clamp)
        out[rows.to(device)] = x
    return out, which


def generate(spec: Any, resolved: Any, seed: int, device, *, profiles: Optional[Sequence[str]] = None,
             out: Optional[dict] = None, values: Optional[Mapping[str, Any]] = None,
             case: Optional[int] = None, given: Optional[Mapping[str, torch.Tensor]] = None,
             spread_peaks: bool = False) -> Inputs:
    """Seeded inputs. The large tensors (weight, hidden, bias, the reference lm_head's) are drawn in
    float32 on their own device, block by block (`draws`: CUDA generators for a CUDA workload, CPU
    generators spread over threads for a CPU one), then rounded into the tensors' dtypes; the [B, T]
    grids (ids, advantages, the rows' profiles, mask, log-probs) with CPU generators, so one seed gives
    the same grids on every device. Log-probs derived from the rounded values in float64. `given`: advantages, ids
    and a mask the caller fixes (`member_inputs.GIVEN`); the rest is drawn given them. `spread_peaks`: each row's
    largest logit a planted peak, the rows' peaks spread over the vocabulary, through the weight rows
    (`generators.spread_peaks`)."""
    given = check_given(given)
    names = tuple(profiles or spec.validation.base_profiles)
    tensors = out if out is not None else allocate(spec, resolved, device)
    gen = torch.Generator().manual_seed(seed & (2**63 - 1))
    member_gen = torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1))
    batch, seq, hidden = tensors["hidden"].shape
    vocab = tensors["weight"].shape[0]
    covered: dict[str, list[str]] = {}
    ids = torch.empty(batch, seq, dtype=torch.int64)
    covered["special_ids"] = token_ids.fill_ids(ids, vocab, gen, case)
    if "completion_ids" in given:  # drawn all the same, as the advantages below
        ids.copy_(given["completion_ids"].reshape(ids.shape))
        covered["special_ids"] = []
    tensors["completion_ids"].copy_(ids)
    adv = torch.empty(tensors["advantages"].shape, dtype=torch.float64)
    dist = spec.validation.advantages
    covered["advantages"] = advantages.fill_advantages(adv, dist.mean, dist.std, dist.min_abs, gen, case)
    if "advantages" in given:  # drawn all the same: the rest of the set is the seed's whatever is given
        adv.copy_(given["advantages"].reshape(adv.shape))
        covered["advantages"] = []
    tensors["advantages"].copy_(adv)

    weight = tensors["weight"]
    draws.fill(weight, seed, draws.WEIGHT, lambda z, rows: z.div_(math.sqrt(hidden)))
    profs = [spec.validation.profile(n) for n in names]
    h, which = _profiled_hidden(batch * seq, hidden, profs, gen, seed, tensors["hidden"].device)
    flat_ids = ids.reshape(-1)
    # no spike on the special ids' rows: a near one-hot row hides whatever a kernel does with its token
    # (grpo_logits/inputs.py, _unpeak)
    special = torch.isin(flat_ids, torch.tensor(token_ids.pool_ids(vocab)))
    host = HostDraws.of(adv, given, seq, seed, case)
    for row, pos in host.binding.items():  # where the clip is made to bind, a gradient to show it by
        special.view(batch, seq)[row, pos] = True
    special = special.to(which.device)
    for k, prof in enumerate(profs):
        if prof.kind == "peaked":
            rows = torch.nonzero((which == k) & ~special).squeeze(-1)
            # the rounded weight rows of these targets only, gathered where the weight lives
            wc = weight.detach()[flat_ids[rows].to(weight.device)].to(h.device, torch.float32)
            h[rows.to(h.device)] += prof.spike * wc / (wc * wc).sum(-1, keepdim=True).clamp_min(1e-12)
    tensors["hidden"].copy_(h.view(batch, seq, hidden))
    del h
    if "bias" in tensors:
        draws.fill(tensors["bias"], seed, draws.BIAS)
    if spread_peaks:  # before the reference lm_head copies the weight, and before the log-probs are derived
        spread_peaks_.place_weight_rows(tensors["hidden"], weight, tensors.get("bias"), ids,
                                      float(GrpoParameters.from_spec(spec, values).temperature), gen)
    # The reference lm_head: the policy's rounded values plus noise drawn beside them, block by block.
    # Relative noise on a weight (bias) is REF_NOISE times its drawn std, 1/sqrt(H) (1): no pass for it.
    for name, base, stream, scale in (("ref_weight", "weight", draws.REF_WEIGHT, REF_NOISE / math.sqrt(hidden)),
                                      ("ref_hidden", "hidden", draws.REF_HIDDEN, REF_HIDDEN_NOISE),
                                      ("ref_bias", "bias", draws.REF_BIAS, REF_NOISE)):
        if name in tensors:
            src = tensors[base].detach()
            draws.fill(tensors[name], seed, stream, lambda z, rows, src=src, scale=scale: z.mul_(scale).add_(src[rows]))
    found: dict[str, Any] = {}
    covered.update(_member_inputs(spec, resolved, tensors, member_gen, values, case, found, given, host))
    return Inputs(tensors, seed, names, covered, found.get("rows"), found.get("temperature", 1.0))


def _member_inputs(spec, resolved, tensors, gen, values, case, found: dict, given, host) -> dict[str, list[str]]:
    covered: dict[str, list[str]] = {}
    batch, seq = tensors["completion_ids"].shape
    keep = torch.ones(batch, seq, dtype=torch.bool)
    if "completion_mask" in tensors:
        keep = fill_completion_mask(tensors["completion_mask"], resolved, spec.validation.member_inputs, gen, case,
                                    given, tensors["advantages"])
        covered["mask_layouts"] = sorted(set(classify(keep)))
    if "old_logprobs" not in tensors and "ref_logprobs" not in tensors:
        return covered
    p = GrpoParameters.from_spec(spec, values)
    rows = generated_row_stats(tensors, p)
    found.update(rows=rows, temperature=float(p.temperature))
    logp = rows.logp.cpu()
    cfg = spec.validation.member_inputs
    if "old_logprobs" in tensors:
        tensors["old_logprobs"].copy_(old_logprobs_for(logp, keep, p, cfg, gen, host))
    if "ref_logprobs" in tensors:
        sign = torch.sign(tensors["advantages"].detach().to("cpu", torch.float64))
        sign = torch.where(sign == 0, 1.0, sign)
        gap = cfg.ref_gap_min + torch.rand(batch, seq, generator=gen, dtype=torch.float64) * (cfg.ref_gap_max - cfg.ref_gap_min)
        tensors["ref_logprobs"].copy_(logp + sign[:, None] * gap)
    return covered


def refresh_in_place(tensors: dict[str, torch.Tensor], offset: int, seed: int) -> None:
    """New bytes for a timed call, cheaply and on the tensors' device (the timed protocols' refresh: a
    full generation draws the [V, H] weight, ~525M normal samples at the seed shapes, and a timed
    workload would make 75 of them; with this refresh it makes 5, `GrpoFusedLinear.refresh`):

    - the vocabulary rotated by `offset`: weight, bias, ref_weight and ref_bias rows move
      (new[v] = old[(v + offset) mod V]) and the completion ids with them (id -> (id - offset) mod V);
    - the hidden dimension permuted (one permutation drawn from `seed`) in hidden, ref_hidden, weight
      and ref_weight alike (every logit the same sum of the same products): every weight byte moves;
    - each row of hidden (and ref_hidden, by the same factor) scaled by a fresh factor in
      [e^-0.1, e^0.1]: every logit of the row scales, so its log-sum-exp moves;
    - each sequence's advantage rescaled by a factor in [e^-0.1, e^0.1] (signs, zeros and the tiny
      class kept), as `grpo_logits.inputs.refresh_in_place` does.

    Rotation and permutation alone would keep every row's logits as a set, and with it the row's
    log-sum-exp: a kernel keying a cache on a row's values up to order (sorted) could skip the logits
    GEMM of a forward and still return correct values, faster than any honest kernel though not below
    the DRAM bound the timing-floor check fails. Scaling the rows closes that; what it gives up: the
    log-probs move (by a few tenths on the wide rows), so the drawn ratios, KL gaps and clip margins of
    a refreshed set are no longer those of its full generation (still finite: old and reference
    log-probs, masks and ids are kept as drawn). The re-checked calls are judged against the reference
    of the values they ran on, as every timed call is (docs/fused-kernel.md, "Check time")."""
    vocab, hidden = tensors["weight"].shape
    k = offset % vocab
    perm = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed & (2**63 - 1)))
    for name in ("weight", "ref_weight", "bias", "ref_bias", "hidden", "ref_hidden"):
        t = tensors.get(name)
        if t is None:
            continue
        new = torch.roll(t, shifts=-k, dims=0) if name in ("weight", "ref_weight", "bias", "ref_bias") else t
        if name not in ("bias", "ref_bias"):
            new = new.index_select(-1, perm.to(t.device))
        t.copy_(new)
    ids = tensors["completion_ids"]
    ids.copy_(torch.remainder(ids.to(torch.int64) - k, vocab).to(ids.dtype))
    h = tensors["hidden"]
    g = torch.Generator(device=h.device).manual_seed((seed ^ 0x5CA1E) & (2**63 - 1))
    rows = torch.empty(h.shape[:-1] + (1,), dtype=torch.float32, device=h.device).uniform_(-0.1, 0.1, generator=g).exp_()
    for name in ("hidden", "ref_hidden"):
        if name in tensors:
            tensors[name].copy_(tensors[name].to(torch.float32) * rows)
    adv = tensors.get("advantages")
    if adv is not None and adv.is_floating_point():
        g = torch.Generator(device=adv.device).manual_seed(seed & (2**63 - 1))
        factor = torch.empty(adv.shape, dtype=torch.float32, device=adv.device).uniform_(-0.1, 0.1, generator=g)
        adv.mul_(torch.exp(factor).to(adv.dtype))
