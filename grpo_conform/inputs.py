"""Seeded inputs, driven by the spec: shapes from the workload, profiles and advantages from
`spec.validation`.

- logits rows get a mix of profiles inside one batch (normal, wide, peaked near one-hot,
  heavy-tailed; the adversarial set adds logits up to 1e4), assigned by a seeded permutation;
- completion ids are uniform over the vocabulary; the special ids (0, 1, 2, vocab-2, vocab-1) sit
  at drawn positions, and a small vocabulary has every id present;
- advantages have both signs at drawn positions (batch >= 2), a clearly non-zero mean, and the
  values GRPO variants produce: tiny magnitudes (down to 1e-6), exact +-1/G, exact 0.

Generation runs on the target device, chunk by chunk, so batch 16 of the seed workload needs
no more than a chunk of float32 scratch beside the logits.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from grpo_conform.dtypes import DTYPES, dtype_name, torch_dtype  # noqa: F401  (re-exported)
from grpo_conform.member_inputs import fill_member_inputs
from grpo_conform.spec import Profile, ResolvedWorkload, Spec

CHUNK_ELEMENTS = 1 << 26


def fresh_seed() -> int:
    """A seed no implementation can derive: drawn from the OS, never passed to a worker."""
    return secrets.randbits(62)


@dataclass(frozen=True)
class Inputs:
    """One set of inputs for a call; `tensors` are keyed by the spec's input names."""

    tensors: dict[str, torch.Tensor]
    seed: int
    profiles: tuple[str, ...]

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
    logits: torch.Tensor, ids: torch.Tensor, spec: Spec, profiles: Sequence[str], gen: torch.Generator
) -> None:
    """Write seeded values into `logits` in place (its address does not change)."""
    batch, seq_next, vocab = logits.shape
    seq = seq_next - 1
    flat = logits.view(batch * seq_next, vocab)
    n_rows = flat.shape[0]
    device = logits.device
    order = torch.randperm(n_rows, generator=gen, device=device) % len(profiles)
    limit = torch.finfo(logits.dtype).max / 4
    step = max(1, CHUNK_ELEMENTS // vocab)
    for start in range(0, n_rows, step):
        stop = min(start + step, n_rows)
        rows = torch.arange(start, stop, device=device)
        for k, name in enumerate(profiles):
            sel = rows[order[start:stop] == k]
            if sel.numel() == 0:
                continue
            profile = spec.validation.profile(name)
            x = _sample(profile, sel.numel(), vocab, gen, device)
            if profile.kind == "peaked":
                b, t = sel // seq_next, sel % seq_next
                target = torch.randint(0, vocab, (sel.numel(),), generator=gen, device=device)
                inside = t < seq
                if seq > 0:
                    target[inside] = ids[b[inside], t[inside]]
                x[torch.arange(sel.numel(), device=device), target] += profile.spike
            flat[sel] = x.clamp_(-limit, limit).to(logits.dtype)


SPECIAL_IDS = (0, 1, 2, -2, -1)  # 0, 1, 2, vocab-2, vocab-1: pad/bos/eos-like ids and the top of the table


def fill_ids(ids: torch.Tensor, vocab: int, seed: int, gen: torch.Generator) -> None:
    """Uniform ids; the special ids sit at parent-drawn positions (never at fixed places a kernel
    could recognise); when there are at least as many tokens as ids, every id appears."""
    n = ids.numel()
    flat = torch.randint(0, vocab, (n,), generator=gen, device=ids.device)
    if n >= vocab:
        flat[:vocab] = torch.arange(vocab, device=ids.device)
    else:
        specials = sorted({s % vocab for s in SPECIAL_IDS})
        if n < len(specials):  # tiny workloads: a seeded choice of which special ids fit
            pick = torch.randperm(len(specials), generator=gen, device=ids.device)[:n].tolist()
            specials = [specials[i] for i in pick]
        flat[: len(specials)] = torch.tensor(specials, device=ids.device)
    flat = flat[torch.randperm(n, generator=gen, device=ids.device)]
    ids.copy_(flat.view(ids.shape))


def fill_advantages(adv: torch.Tensor, spec: Spec, gen: torch.Generator) -> None:
    """Advantages of both signs (placed at random) with a mean far from 0, including the values
    GRPO variants produce: magnitudes down to 1e-6, exact +-1/G, and exact 0 when batch >= 4."""
    dist = spec.validation.advantages
    n = adv.numel()
    values = torch.randn(n, generator=gen, dtype=torch.float64) * dist.std + dist.mean
    sign = torch.where(values < 0, -1.0, 1.0).to(torch.float64)
    values = sign * values.abs().clamp_min(dist.min_abs)
    order = torch.randperm(n, generator=gen).tolist()
    if n >= 2:
        # Both signs at drawn positions; the mean is made far from 0 below.
        values = values.abs()
        values[order[0]] = -values[order[0]]
    specials = []
    if n >= 3:
        g = (2, 4, 8, 16)[int(torch.randint(0, 4, (1,), generator=gen))]
        specials.append(10 ** float(torch.empty(1, dtype=torch.float64).uniform_(-6.0, -2.0, generator=gen)))
        specials.append(1.0 / g)  # what a group of G samples with one success gives, normalised
    if n >= 4:
        specials.append(0.0)  # a group whose rewards all tie
    specials = specials[: max(0, n - 2)]  # one ordinary value of each sign stays
    special_at = order[1 : 1 + len(specials)]
    for k, v in zip(special_at, specials):
        values[k] = v if values[k] >= 0 else -v
    if n >= 2:
        # A mean far from 0, so a dropped sign cannot hide: the ordinary positive values grow.
        ordinary = torch.ones(n, dtype=torch.bool)
        ordinary[special_at] = False
        grow = ordinary & (values > 0)
        while grow.any() and abs(float(values.mean())) < 0.25 * float(values.abs().mean()):
            values[grow] *= 2.0
    if n == 1:  # one sequence: a drawn magnitude class (ordinary, 1/G, tiny)
        kind = int(torch.randint(0, 3, (1,), generator=gen))
        if kind == 1:
            values[0] = 0.25 if values[0] >= 0 else -0.25
        elif kind == 2:
            values[0] = 1e-4 if values[0] >= 0 else -1e-4
    adv.copy_(values.to(adv.dtype))


def generate(
    spec: Spec,
    resolved: ResolvedWorkload,
    seed: int,
    device: str | torch.device,
    profiles: Sequence[str] | None = None,
    out: dict[str, torch.Tensor] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Inputs:
    """Seeded inputs for a workload. With `out`, values are written in place into those tensors.
    `values`: the call's parameter values (drawn ones), which the members' old log-probs follow."""
    profiles = tuple(profiles or spec.validation.base_profiles)
    tensors = out if out is not None else allocate(resolved, spec, device)
    device = tensors["logits"].device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    vocab = resolved.axes[spec.input("completion_ids").range.max_exclusive]
    fill_ids(tensors["completion_ids"], vocab, seed, gen)
    cpu_gen = torch.Generator().manual_seed(seed ^ 0x5DEECE66D)
    adv = torch.empty(tensors["advantages"].shape, dtype=tensors["advantages"].dtype)
    fill_advantages(adv, spec, cpu_gen)
    tensors["advantages"].copy_(adv)
    fill_logits(tensors["logits"], tensors["completion_ids"], spec, profiles, gen)
    fill_member_inputs(spec, resolved, tensors, seed, values)  # mask, old/ref log-probs, sampling ratio
    return Inputs(tensors, seed, profiles)


def clone_inputs(inputs: Inputs) -> Inputs:
    return Inputs({k: v.clone() for k, v in inputs.tensors.items()}, inputs.seed, inputs.profiles)
