"""Per-sequence scalars (kind `sequence-scalar`: advantages), with the values GRPO variants produce.

Both signs at drawn positions (batch >= 2) and a mean clearly away from 0 (a dropped sign cannot
hide), plus the special values:
- `tiny`: |A| drawn log-uniform in [1e-3, 0.035] (below the 0.04 a kernel might treat as zero, and large
  enough that a gradient zeroed there is outside the tolerance: at 1e-6 a zeroed batch-1 gradient passed);
- `exact-tiny`: 2^-k, k in 5..20: exactly representable, what normalised rewards of large groups give;
- `group`: exactly 1/G, G in {2, 4, 8, 16}: one success in a group of G, normalised;
- `zero`: exactly 0 (a group whose rewards all tie), batch >= 4.
Where a batch has too few rows for every case, `case` rotates them over the workload's input sets:
batch >= 3: a small value (tiny or exact-tiny, alternating) in every set, then (batch >= 4) 0, then
1/G, the other small one as rows allow; batch 2: one ordinary value and one special (tiny, exact-tiny, 1/G in
turn: calls A and D hold a small one); batch 1: tiny, ordinary, exact-tiny, 1/G in turn (call A
tiny). The review's kernel zeroing sequences with |A| < 0.04 passed every batch-2 workload when
small values were only drawn from batch 3 up.
"""

from __future__ import annotations

import math

import torch

SMALL_MAX = 0.035
SMALL_MIN = 1e-3  # the exact-tiny case reaches 2^-20; a tiny case must stay judgeable


def _special(kind: str, gen: torch.Generator) -> float:
    if kind == "tiny":
        return 10 ** float(torch.empty(1, dtype=torch.float64).uniform_(math.log10(SMALL_MIN), math.log10(SMALL_MAX), generator=gen))
    if kind == "exact-tiny":
        return 2.0 ** -int(torch.randint(5, 21, (1,), generator=gen))
    if kind == "group":
        return 1.0 / (2, 4, 8, 16)[int(torch.randint(0, 4, (1,), generator=gen))]
    if kind == "zero":
        return 0.0
    raise ValueError(kind)


def _small(case: int | None, gen: torch.Generator) -> str:
    if case is None:
        return ("tiny", "exact-tiny")[int(torch.randint(0, 2, (1,), generator=gen))]
    return ("tiny", "exact-tiny")[case % 2]


def special_kinds(n: int, case: int | None, gen: torch.Generator) -> list[str]:
    """Which special values this set of n advantages holds."""
    if n == 1:
        k = int(torch.randint(0, 4, (1,), generator=gen)) if case is None else case % 4
        return [("tiny", "ordinary", "exact-tiny", "group")[k]] if k != 1 else []
    if n == 2:
        k = int(torch.randint(0, 3, (1,), generator=gen)) if case is None else case % 3
        return [("tiny", "exact-tiny", "group")[k]]
    # from batch 4 a zero in every set, before 1/G: a group whose rewards tie is GRPO's commonest special value, and
    # with 1/G first a batch-4 set never held one, so only the zero-advantage probe's calls did (a kernel leaving
    # A = 0 rows out of the batch mean under autocast, no_grad, a non-leaf view or strides passed: docs/checks.md)
    kinds = [_small(case, gen)] + (["zero"] if n >= 4 else []) + ["group"]
    if n >= 5:
        kinds.append("tiny" if kinds[0] == "exact-tiny" else "exact-tiny")
    return kinds[: n - 2]  # one ordinary value of each sign stays


def fill_advantages(adv: torch.Tensor, mean: float, std: float, min_abs: float, gen: torch.Generator,
                    case: int | None = None) -> list[str]:
    """Write the advantages in place; returns the cases they hold (`ordinary` and the specials)."""
    n = adv.numel()
    values = torch.randn(n, generator=gen, dtype=torch.float64) * std + mean
    sign = torch.where(values < 0, -1.0, 1.0).to(torch.float64)
    values = sign * values.abs().clamp_min(min_abs)
    order = torch.randperm(n, generator=gen).tolist()
    if n >= 2:
        values = values.abs()
        values[order[0]] = -values[order[0]]  # both signs, at drawn positions
    kinds = special_kinds(n, case, gen)
    special_at = order[1 : 1 + len(kinds)] if n >= 2 else order[: len(kinds)]
    for k, kind in zip(special_at, kinds):
        v = _special(kind, gen)
        values[k] = v if values[k] >= 0 else -v
    if n >= 2:
        # A mean far from 0, so a dropped sign cannot hide: ordinary values of one sign grow.
        ordinary = torch.ones(n, dtype=torch.bool)
        ordinary[special_at] = False
        grow = ordinary & (values > 0)
        if not grow.any():
            grow = ordinary & (values < 0)
        while grow.any() and abs(float(values.mean())) < 0.25 * float(values.abs().mean()):
            values[grow] *= 2.0
    adv.copy_(values.to(adv.dtype))
    return sorted(set(kinds) | ({"ordinary"} if len(kinds) < n else set()))
