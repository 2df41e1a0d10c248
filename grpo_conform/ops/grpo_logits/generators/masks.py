"""Completion masks (kind `mask`): the layouts trainers produce, row by row.

- `right`: a completion followed by padding (TRL, verl);
- `left`: padding first (left-padded batches, prompts and completions packed to the right);
- `holes`: interior zero runs inside a completion (tool-output and multi-turn masks: tokens the
  policy did not sample are masked in the middle);
- `single`: exactly one unmasked token;
- `full`: no padding; `empty`: a fully masked row.
A whole batch with no unmasked token is a call of its own (`all_masked`), made by the validator's
`input-cases` probe: putting it in an ordinary call would leave that call's checks nothing to see.
`zero_apart` places the drawn rows against the set's advantages: the richest row holds the largest |A|, and a zero
sits on no row of at most one token where a richer row can take it.

Every row's layout is read back from the mask itself (`classify`), so what `draws` reports is what
the implementation got, also where a short row cannot hold the layout asked for. Values are 0/1 in
every dtype the input allows (bool, int64, int32: TRL's masks are int).
"""

from __future__ import annotations

import math

import torch

UNTIMED = ("right", "left", "holes", "single", "full", "empty")


def classify(keep: torch.Tensor) -> list[str]:
    """The layout of each row of a [B, S] bool mask."""
    out = []
    seq = keep.shape[1]
    for row in keep.tolist():
        n = sum(row)
        if n == 0:
            out.append("empty")
        elif n == seq:
            out.append("full")
        elif n == 1:
            out.append("single")
        else:
            first, last = row.index(True), seq - 1 - row[::-1].index(True)
            if last - first + 1 != n:
                out.append("holes")
            elif first == 0:
                out.append("right")
            elif last == seq - 1:
                out.append("left")
            else:
                out.append("holes")  # padded on both sides: a completion inside a packed row
    return out


def _row(layout: str, seq: int, gen: torch.Generator) -> torch.Tensor:
    t = torch.arange(seq)

    def draw(lo: int, hi: int) -> int:  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=gen)) if hi > lo else lo

    if layout == "empty":
        return torch.zeros(seq, dtype=torch.bool)
    if layout == "full" or seq == 1:
        return torch.ones(seq, dtype=torch.bool)
    if layout == "single":
        return t == draw(0, seq - 1)
    if layout in ("right", "left"):
        n = draw(2 if seq >= 3 else 1, seq - 1)
        return t < n if layout == "right" else t >= seq - n
    # holes: a completion of n >= 3 tokens (right-padded or full) with one or two interior zero runs
    if seq < 3:
        return t == draw(0, seq - 1)
    n = draw(3, seq)
    keep = t < n
    for _ in range(1 + (n >= 7 and draw(0, 1))):
        a = draw(1, n - 2)
        b = draw(a + 1, min(n - 1, a + max(1, n // 3)))
        keep[a:b] = False
    return keep


EDGES = ("empty", "single", "full")  # the kept counts a per-row normaliser can get wrong: 0, 1 and S
ORDINARY = ("right", "left", "holes")


def edge_layouts(batch: int, case: int) -> list[str]:
    """The EDGES a set of `batch` rows holds: min(3, batch - 1) of them (at least one ordinary row stays), rotated
    by `case`; all three from batch 4 on."""
    k = min(len(EDGES), batch - 1)
    return [EDGES[(case * k + i) % len(EDGES)] for i in range(max(k, 0))]


def row_layouts(batch: int, case: int | None, gen: torch.Generator) -> list[str]:
    """The layouts asked for, one per row, rows shuffled. With `case` (the workload's input-set count): from batch 2
    on, min(3, batch - 1) rows take EDGES (all three from batch 4 on, in every set) and the rest ORDINARY, each
    rotated by `case`; from batch 6 on every set holds all six. Every probe's set so meets the edge rows whatever
    its place in the workload's order: with the plain rotation of UNTIMED by `case`, a set at batch 4 held 4 of 6
    layouts, always the same 4 for the same probe (a kernel wrong only for a single-token row under autocast, or
    for a non-leaf view of the logits, passed every run). A batch of one rotates UNTIMED and never gets `empty`
    (see all_masked). Without `case`: drawn."""
    if case is None:
        names = [UNTIMED[i] for i in torch.randint(0, len(UNTIMED), (batch,), generator=gen).tolist()]
    elif batch == 1:
        names = [UNTIMED[case % len(UNTIMED)]]
    elif batch >= len(UNTIMED):
        names = list(UNTIMED) + [UNTIMED[(case * batch + b) % len(UNTIMED)] for b in range(batch - len(UNTIMED))]
    else:
        names = edge_layouts(batch, case)
        names += [ORDINARY[(case * (batch - len(names)) + i) % len(ORDINARY)] for i in range(batch - len(names))]
    if batch == 1 and names[0] == "empty":
        names[0] = "holes"
    order = torch.randperm(batch, generator=gen).tolist()
    return [names[i] for i in order]


def timed_rows(batch: int, seq: int, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """Timed workloads: about `fraction` of the tokens unmasked (the anchors' configuration), each
    row right- or left-padded at random (their conformance sets add the edge rows: `with_edge_rows`)."""
    low = max(0, min(seq, math.ceil(seq * (2 * fraction - 1))))
    lengths = torch.randint(low, seq + 1, (batch,), generator=gen)
    t = torch.arange(seq)[None, :]
    left = torch.rand(batch, generator=gen) < 0.5
    return torch.where(left[:, None], t >= seq - lengths[:, None], t < lengths[:, None])


def with_edge_rows(keep: torch.Tensor, case: int, gen: torch.Generator) -> torch.Tensor:
    """`keep` with drawn rows replaced by the set's `edge_layouts` (as row_layouts):
    a timed workload's conformance sets keep the anchors' padded rows and meet the edge rows too. Before, a CUDA
    workload of batch 8 (a kernel's large-batch grid, its own path) never held an empty, single-token or full row
    in any call: only the untimed workloads' sets did."""
    batch, seq = keep.shape
    names = edge_layouts(batch, case)
    if not names:
        return keep
    out = keep.clone()
    for row, name in zip(torch.randperm(batch, generator=gen)[: len(names)].tolist(), names):
        out[row] = _row(name, seq, gen)
    return out


def draw_mask(batch: int, seq: int, case: int | None, timed: bool, fraction: float,
              gen: torch.Generator) -> torch.Tensor:
    """A [B, S] bool mask; at least one unmasked token in the batch."""
    if timed:
        keep = timed_rows(batch, seq, fraction, gen)
        if case is not None:  # a conformance set of a timed workload (timing's sets come without a case)
            keep = with_edge_rows(keep, case, gen)
    else:
        keep = torch.stack([_row(name, seq, gen) for name in row_layouts(batch, case, gen)]) if batch else \
            torch.zeros(0, seq, dtype=torch.bool)
    if seq and batch and not keep.any():  # one live token, so the call has something to judge
        keep[int(torch.randint(0, batch, (1,), generator=gen)), int(torch.randint(0, seq, (1,), generator=gen))] = True
    return keep


def zero_apart(keep: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """`keep` with its rows moved (the layouts stay the same multiset; no draw, so `drawn_keep` agrees) so that
    1. the row keeping the most tokens holds the largest |A|: with the small and zero advantages every set from
       batch 4 holds, drawn apart from the edge rows, the full row was deaf to a dropped clip in 28 of 360 sets
       (gallery shallow-graph passed a suite run), 10 of 360 with any ordinary |A| there, 1 with the largest;
    2. no zero advantage sits on a row keeping at most one token (the row's edge hid: a single-token row halved,
       an empty row counted as full, times A = 0, nothing; gallery non-leaf-single-token-rows-halved was missed in
       1 run of 7); it takes the least rich other row of two or more."""
    a = advantages.detach().to("cpu", torch.float64).reshape(-1)
    if a.numel() != keep.shape[0] or keep.shape[0] < 2:
        return keep
    out = keep.clone()
    kept = lambda j: int(out[j].sum())  # noqa: E731
    rows = range(out.shape[0])
    richest, largest = max(rows, key=kept), max(rows, key=lambda j: abs(float(a[j])))
    if abs(float(a[richest])) < abs(float(a[largest])):
        out[[richest, largest]] = out[[largest, richest]]
        richest = largest
    for z in [j for j in rows if a[j] == 0 and kept(j) <= 1]:
        others = [j for j in rows if j != richest and a[j] != 0 and kept(j) > 1]
        if others:
            c = min(others, key=kept)
            out[[z, c]] = out[[c, z]]
    return out
