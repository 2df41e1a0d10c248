"""Seeded inputs, driven by the spec: shapes from the workload, profiles and advantages from
`spec.validation`.

- logits rows get a mix of profiles inside one batch (normal, wide, peaked near one-hot,
  heavy-tailed; the adversarial set adds logits up to 1e4), assigned by a seeded permutation;
- completion ids are uniform over the vocabulary plus a drawn subset (sometimes none) of the ids
  tokenizers reserve (generators.token_ids), and a small vocabulary has every id present;
- advantages have both signs at drawn positions (batch >= 2), a clearly non-zero mean, and the
  values GRPO variants produce (generators.advantages): tiny magnitudes (1e-6 to 0.035), exact
  powers of two, exact +-1/G, exact 0, at every batch size.

Generation runs on the target device, chunk by chunk, so batch 16 of the seed workload needs
no more than a chunk of float32 scratch beside the logits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from grpo_conform.dtypes import DTYPES, dtype_name, torch_dtype  # noqa: F401  (re-exported)
from grpo_conform.ops.grpo_logits.generators import advantages, token_ids
from grpo_conform.ops.grpo_logits.generators import spread_peaks as spread_peaks_
from grpo_conform.ops.grpo_logits.member_inputs import (
    HostDraws, check_given, drawn_keep, fill_member_inputs, host_to,
)
from grpo_conform.ops.grpo_terms import GrpoParameters
from grpo_conform.ops.interface import fresh_seed  # noqa: F401  (re-exported: an operation-independent seed)
from grpo_conform.spec import Profile, ResolvedWorkload, Spec

CHUNK_ELEMENTS = 1 << 26
KERNEL_SALT = 0x2545F4914F6CDD1D  # the kernel draw's Philox seed: the device generator's seed, salted
KERNEL_DRAW_ENV = "GRPO_CONFORM_KERNEL_DRAW"  # "0": torch's draw on CUDA too (what the kernel replaced)


def kernel_draw(logits: torch.Tensor) -> bool:
    """Whether the logits are drawn by generators/logits_kernel.py: contiguous CUDA logits, unless
    GRPO_CONFORM_KERNEL_DRAW=0. The CPU keeps torch's draw (and never imports Triton for it)."""
    return logits.is_cuda and logits.is_contiguous() and os.environ.get(KERNEL_DRAW_ENV, "1") != "0"
#: What an input set's `covered` holds, by key, and the workload's `draws` key it accumulates into
#: (`checks/conformance.WorkloadConformance.cover`; the coverage list reads the draws). Every GRPO
#: operation's inputs report these keys (grpo-fused-linear's too).
COVERAGE_DRAWS = (("mask_layouts", "mask_layouts"), ("mask_dtypes", "mask_dtypes"),
                  ("advantages", "advantage_cases"), ("special_ids", "special_ids"), ("input_ties", "input_ties"))


@dataclass(frozen=True)
class Inputs:
    """One set of inputs for a call; `tensors` are keyed by the spec's input names."""

    tensors: dict[str, torch.Tensor]
    seed: int
    profiles: tuple[str, ...]
    covered: dict[str, list[str]] = field(default_factory=dict)  # cases the generators placed
    logp: Any = None  # float64 [B, S] log-probs of these logits at `values`' temperature, where computed

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def allocate(resolved: ResolvedWorkload, spec: Spec, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Uninitialised tensors of the workload's shapes and dtypes."""
    out = {}
    for t in spec.inputs:
        dtype = torch_dtype(resolved.dtypes.get(t.name, t.dtypes[0]))
        out[t.name] = torch.empty(resolved.shapes[t.name], dtype=dtype, device=device)
    return out


def _sample(profile: Profile, n: int, vocab: int, gen: torch.Generator, device) -> torch.Tensor:
    shape = (n, vocab)
    if profile.kind == "student_t":
        df = max(1, round(profile.df))
        chi2 = torch.zeros(shape, device=device)
        for _ in range(df):
            chi2 += torch.randn(shape, generator=gen, device=device) ** 2
        x = torch.randn(shape, generator=gen, device=device) / torch.sqrt(chi2 / df).clamp_min(1e-6)
    else:
        x = torch.randn(shape, generator=gen, device=device)
    x *= profile.scale
    if profile.clamp is not None:
        x.clamp_(-profile.clamp, profile.clamp)
    return x


def fill_logits(
    logits: torch.Tensor, ids: torch.Tensor, spec: Spec, profiles: Sequence[str], gen: torch.Generator,
    resolvable: torch.Tensor | None = None, unpeaked: torch.Tensor | None = None, keep: torch.Tensor | None = None,
) -> None:
    """Write seeded values into `logits` in place (its address does not change). `resolvable` [batch]
    (bool): sequences that get at least one kept scored row (`keep` [batch, seq] on the host, default all) of a
    profile other than `peaked`. `unpeaked` [batch, seq] (bool): scored rows that never get a `peaked` profile
    (`_unpeak`)."""
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    flat = logits.view(batch * seq_next, vocab)
    n_rows = flat.shape[0]
    device = logits.device
    order = torch.randperm(n_rows, generator=gen, device=device) % len(profiles)
    if resolvable is not None and seq > 0:
        _resolvable_rows(order.view(batch, seq_next), resolvable.to(device), spec, profiles, gen, keep)
    if unpeaked is not None and seq > 0:
        _unpeak(order.view(batch, seq_next), unpeaked.to(device), spec, profiles, gen)
    limit = torch.finfo(logits.dtype).max / 4
    targets = torch.nn.functional.pad(ids.to(torch.int64), (0, 1)).reshape(-1)  # each row's target (0 on the last)
    if kernel_draw(logits):
        # one Triton pass on CUDA (generators/logits_kernel.py): the same profiles, no host round trip;
        # local: Triton is imported only where a GPU runs it (optional on the CPU)
        from grpo_conform.ops.grpo_logits.generators import logits_kernel

        drawn = torch.randint(0, vocab, (n_rows,), generator=gen, device=device)  # the last positions' spike
        if seq > 0:
            drawn = torch.where(torch.arange(n_rows, device=device) % seq_next < seq, targets, drawn)
        table = logits_kernel.profile_table([spec.validation.profile(n) for n in profiles], device)
        logits_kernel.fill_rows(flat, order, drawn, table, gen.initial_seed() ^ KERNEL_SALT, limit)
        return
    step = max(1, CHUNK_ELEMENTS // vocab)
    # Which rows each draw fills, worked out on the host from one copy of `order`, then sent in one copy:
    # a boolean-mask index per chunk and profile made the host wait for the GPU ~200 times a batch-8 set.
    spans, picked = _row_selections(order.cpu(), step, len(profiles))
    selected = host_to(picked, device)
    for (k, a, b) in spans:
        sel, n = selected[a:b], b - a
        profile = spec.validation.profile(profiles[k])
        x = _sample(profile, n, vocab, gen, device)
        if profile.kind == "peaked":
            target = torch.randint(0, vocab, (n,), generator=gen, device=device)
            if seq > 0:  # scored rows spike at their token; the last position at the drawn one
                target = torch.where(sel % seq_next < seq, targets[sel], target)
            x[torch.arange(n, device=device), target] += profile.spike
        flat[sel] = x.clamp_(-limit, limit).to(logits.dtype)


def _row_selections(order: torch.Tensor, step: int, profiles: int) -> tuple[list[tuple[int, int, int]], torch.Tensor]:
    """In the order the draws are made (chunks of `step` rows, profiles in turn): (profile, a, b) for
    each non-empty selection, its rows being picked[a:b]."""
    spans, parts, at = [], [], 0
    rows = torch.arange(order.numel())
    for start in range(0, order.numel(), step):
        chunk = order[start : start + step]
        for k in range(profiles):
            sel = rows[start : start + step][chunk == k]
            if sel.numel():
                spans.append((k, at, at + sel.numel()))
                parts.append(sel)
                at += sel.numel()
    return spans, torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def _unpeak(order: torch.Tensor, unpeaked: torch.Tensor, spec: Spec, profiles: Sequence[str],
            gen: torch.Generator) -> None:
    """The rows of the special ids (pad/bos/eos-like and top-of-table, generators/token_ids.py) get a
    drawn profile other than `peaked`: on a near one-hot row the token's gradient s (1 - p_t) is below
    every allowance, so a kernel that drops those tokens (treats them as padding) passed every call whose
    special ids all sat on peaked rows: ~19% of call A's sets at odd-vocab and small-bf16, and gallery
    treats-special-ids-as-padding passed once in a slow-lane run (2026-12-03)."""
    peaked = [k for k, n in enumerate(profiles) if spec.validation.profile(n).kind == "peaked"]
    others = [k for k in range(len(profiles)) if k not in peaked]
    if not peaked or not others:
        return
    scored = order[:, : order.shape[1] - 1]
    fix = (unpeaked & torch.isin(scored, torch.tensor(peaked, device=order.device))).nonzero(as_tuple=True)
    if fix[0].numel():
        # one draw for every row to fix, in the row-major order the former per-row loop used: on the CPU the same
        # values (torch's CPU generator draws a tensor element by element), on CUDA without a launch and a host
        # read per row (2.5 s of a member's reach calls on an H100: the seq call fixes thousands of rows)
        pick = torch.randint(len(others), (fix[0].numel(),), generator=gen, device=order.device)
        scored[fix] = torch.tensor(others, dtype=order.dtype, device=order.device)[pick]


def _resolvable_rows(order: torch.Tensor, resolvable: torch.Tensor, spec: Spec, profiles: Sequence[str],
                     gen: torch.Generator, keep: torch.Tensor | None = None) -> None:
    """A near one-hot row (`peaked`: p_t ~ 1) has a gradient s * (1 - p_t) below every fp32 floor, so a
    sequence whose kept scored rows are all peaked is judged on nothing: a kernel that zeroes the gradient
    of small-|A| sequences passed batch1-seq1 whenever its one row was peaked (half the draws; docs/
    checks.md, row 7). Such a sequence gets a drawn other profile on its first kept scored row. Masked rows
    count for nothing (batch-one-shortcut passed `gradient` on mask-b1-long's call A when both kept rows
    were peaked, ~1 draw in 1,700; generators/judged_rows.py keeps such a row unclipped)."""
    peaked = [k for k, n in enumerate(profiles) if spec.validation.profile(n).kind == "peaked"]
    others = [k for k in range(len(profiles)) if k not in peaked]
    if not peaked or not others:
        return
    scored = order[:, : order.shape[1] - 1]
    live = torch.ones(scored.shape, dtype=torch.bool) if keep is None else keep.to("cpu", torch.bool)
    dead = ~live.to(order.device)
    fix = resolvable & live.any(dim=1).to(order.device) & (dead | torch.isin(scored, torch.tensor(
        peaked, device=order.device))).all(dim=1)
    for b in fix.nonzero().flatten().tolist():
        pick = int(torch.randint(len(others), (1,), generator=gen, device=order.device))
        scored[b, int(live[b].nonzero()[0])] = others[pick]


def fill_advantages(adv: torch.Tensor, spec: Spec, gen: torch.Generator, case: int | None = None) -> list[str]:
    """The spec's advantage distribution through `generators.advantages` (both signs, a clear mean,
    tiny, exactly representable tiny, 1/G and 0 values as the batch and `case` allow)."""
    dist = spec.validation.advantages
    return advantages.fill_advantages(adv, dist.mean, dist.std, dist.min_abs, gen, case)


def generate(
    spec: Spec,
    resolved: ResolvedWorkload,
    seed: int,
    device: str | torch.device,
    profiles: Sequence[str] | None = None,
    out: dict[str, torch.Tensor] | None = None,
    values: Mapping[str, Any] | None = None,
    case: int | None = None,
    given: Mapping[str, torch.Tensor] | None = None,
    spread_peaks: bool = False,
) -> Inputs:
    """Seeded inputs for a workload. With `out`, values are written in place into those tensors.
    `values`: the call's parameter values (drawn ones), which the members' old log-probs follow.
    `case`: the index of this input set in its workload (generators rotate layouts with it; None:
    drawn from the seed alone). `Inputs.covered` says what the set holds (for the workload's draws).
    `given`: advantages, a mask and ids the caller fixes (`member_inputs.GIVEN`); the rest is drawn given them.
    `spread_peaks`: each row's largest logit a planted peak, the rows' peaks spread over the vocabulary
    (`generators.spread_peaks`)."""
    given = check_given(given)
    profiles = tuple(profiles or spec.validation.base_profiles)
    tensors = out if out is not None else allocate(resolved, spec, device)
    device = tensors["logits"].device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    vocab = resolved.axes[spec.input("completion_ids").range.max_exclusive]
    cpu_gen = torch.Generator().manual_seed(seed ^ 0x5DEECE66D)
    covered: dict[str, list[str]] = {}
    covered["special_ids"] = token_ids.fill_ids(tensors["completion_ids"], vocab, cpu_gen, case)
    if "completion_ids" in given:  # drawn all the same, as the advantages below
        tensors["completion_ids"].copy_(given["completion_ids"].reshape(tensors["completion_ids"].shape))
        covered["special_ids"] = []
    adv = torch.empty(tensors["advantages"].shape, dtype=tensors["advantages"].dtype)
    covered["advantages"] = fill_advantages(adv, spec, cpu_gen, case)
    if "advantages" in given:  # drawn all the same: the rest of the set is the seed's whatever is given
        adv.copy_(given["advantages"].reshape(adv.shape))
        covered["advantages"] = []
    tensors["advantages"].copy_(adv)
    # Sequences of small |A| (the cases generators.advantages places) must be resolvable: see _resolvable_rows
    small = (adv.abs() <= advantages.SMALL_MAX) & (adv != 0)
    special = torch.isin(tensors["completion_ids"].to(torch.long),
                         torch.tensor(token_ids.pool_ids(vocab), device=tensors["completion_ids"].device))
    host = HostDraws.of(adv, given, tensors["completion_ids"].shape[1], seed, case)
    for row, pos in host.binding.items():  # where the clip is made to bind, a gradient to show it by
        special[row, pos] = True
    keep = drawn_keep(spec, resolved, tuple(tensors["completion_ids"].shape), seed, case, given, adv) \
        if "completion_mask" in tensors else None
    fill_logits(tensors["logits"], tensors["completion_ids"], spec, profiles, gen, resolvable=small, unpeaked=special,
                keep=keep)
    if spread_peaks:  # before the log-probs are derived (the exact-tie rows drawn after keep their own shape)
        targets = torch.nn.functional.pad(tensors["completion_ids"].to(torch.int64), (0, 1)).reshape(-1)
        spread_peaks_.place_logits(tensors["logits"].view(-1, vocab), targets,
                                 float(GrpoParameters.from_spec(spec, values).temperature), cpu_gen)
    found: dict[str, Any] = {}
    # mask, log-probs, ratios
    covered.update(fill_member_inputs(spec, resolved, tensors, seed, values, case, found, given, host))
    return Inputs(tensors, seed, profiles, covered, found.get("logp"))


def refresh_in_place(tensors: dict[str, torch.Tensor], offset: int) -> None:
    """New bytes for a timed call, cheaply: every logits row rotated by `offset` along the vocabulary
    and the completion ids moved with it (new[v] = old[(v + offset) mod V], id -> (id - offset) mod V),
    in place on the tensors' device. Each row keeps its values as a set and its target's, so the
    log-probs, and with them every drawn ratio, KL gap and clip-boundary margin, are exactly those
    of the full generation before; masks, advantages and the other inputs stay. Every logits byte
    moves unless a row is constant, so a cache of results by address or content misses as on fresh
    inputs (docs/timing.md, "Timed refreshes"). One read and one write of the logits, no float64
    work: a full generation (randn by row profile, and for members with old log-probs a float64
    log-softmax of every row) costs ~75 times that per timed workload."""
    logits, ids = tensors["logits"], tensors["completion_ids"]
    vocab = logits.shape[-1]
    k = offset % vocab
    if k == 0:
        return
    logits.copy_(torch.roll(logits, shifts=-k, dims=-1))
    ids.copy_(torch.remainder(ids.to(torch.int64) - k, vocab).to(ids.dtype))
    # Each sequence's advantage rescaled by a fresh factor in [e^-0.1, e^0.1] (sign, zeros and the
    # tiny class kept): a rotation alone leaves the loss, and every [batch, seq] input, as they were,
    # so a kernel caching its results keyed by the small inputs (advantages, log-probs, row index)
    # and undoing the rotation would answer a refresh from its cache. With new advantages the loss
    # and every gradient row change; what a cache could still reuse (a row's logsumexp, rotation
    # invariant) saves no pass below the floor's one read and one write (docs/timing.md).
    adv = tensors.get("advantages")
    if adv is not None and adv.is_floating_point():
        g = torch.Generator(device=adv.device).manual_seed(offset)
        factor = torch.empty(adv.shape, dtype=torch.float32, device=adv.device).uniform_(-0.1, 0.1, generator=g)
        adv.mul_(torch.exp(factor).to(adv.dtype))


def clone_inputs(inputs: Inputs) -> Inputs:
    return Inputs({k: v.clone() for k, v in inputs.tensors.items()}, inputs.seed, inputs.profiles, dict(inputs.covered),
                  inputs.logp)
