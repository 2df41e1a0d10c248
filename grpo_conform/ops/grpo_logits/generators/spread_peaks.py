"""Spread peaks: each row's largest logit a planted peak, clear of the rest of the row, the rows' peaks spread over
the vocabulary (one row in each of R equal strata).

Why: an online log-sum-exp over vocabulary tiles that forgets to rescale its running sum when a later tile
raises the maximum is exact wherever every row's maximum sits in the first tile it reads, and only slightly
wrong where the later maxima rise little. Drawn logits put the maximum anywhere and raise it by chance amounts,
so on the reach probe's vocabulary call (4-9 rows, hidden 8-32) one draw in a few hundred left such a kernel
inside tolerance (clean-clone CI run 182, docs/timing.md). A peak PEAK_MARGIN row scales above every other
logit of its row makes that kernel's sum wrong on every row whose peak lies outside the first region it reads.
The strata put the peaks everywhere: whatever order a kernel reads the vocabulary in, and however it splits it,
a first region of half the vocabulary or less holds at most about half the rows' peaks. (The first form put
every peak in the upper half: a kernel reading the upper half first, as one tile, and the lower half after it
without a rescale, then passed; gallery `reach-vocab-halves`.) The reach probe asks for them on its vocabulary
call only (`spread_peaks=True`); every other draw keeps the profiles' shapes.
"""

from __future__ import annotations

import torch

PEAK_MARGIN = 4.0  # row scales (the row's std, at least 1) times the temperature (at least 1) above the rest of the row


def peak_columns(targets: torch.Tensor, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """One column per row: the rows, in a drawn order, take the R equal strata of the vocabulary in turn, each a
    column drawn inside its stratum (so the columns are distinct), never the row's own target (a peak on the target
    makes the row near one-hot at the token, which hides what a kernel does with it).

    The last stratum's column is the vocabulary's last one: a kernel that drops any part of a partial last block (a
    log-sum-exp over fixed-width blocks that skips the remainder) then misses that row's whole mass, however few
    columns it drops. Drawn inside the stratum, the peak fell in the fused vocabulary call's 255-261-column tail
    (V 139,519-139,525, 4-9 rows) in one draw of 60-140, so such a kernel was judged on the tail's small share of
    the rows' mass alone, and one gallery run passed it (`fused-bf16-vocab-tail-block-skipped`, forty-third
    session)."""
    rows = targets.numel()
    if vocab < 2 * rows:
        raise ValueError(f"spread peaks need a vocabulary of at least {2 * rows} for {rows} rows, got {vocab}")
    stratum = torch.randperm(rows, generator=gen)
    lo, hi = stratum * vocab // rows, (stratum + 1) * vocab // rows  # every stratum at least 2 wide
    cols = lo + (torch.rand(rows, generator=gen, dtype=torch.float64) * (hi - lo)).long().clamp(max=hi - lo - 1)
    last = stratum == rows - 1
    cols = torch.where(last, hi - 1, cols)
    own = cols == targets.reshape(-1).cpu().to(torch.int64)
    # a target in the last column: that row's peak one column before it, still in any partial last block of 2+
    moved = torch.where(last, hi - 2, lo + (cols - lo + 1) % (hi - lo))
    return torch.where(own, moved, cols)


def peak_heights(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """For rows of logits `z` [R, V] (float), the height each row's peak needs: its largest logit plus the
    margin in row scales."""
    scale = z.std(-1).clamp_min(1.0) * max(1.0, float(temperature))
    return z.amax(-1) + PEAK_MARGIN * scale


def place_logits(flat: torch.Tensor, targets: torch.Tensor, temperature: float, gen: torch.Generator) -> None:
    """Logits rows `flat` [R, V] in place: each row's peak column set to its height (within the dtype's range
    less a factor 4, where the generator clamps)."""
    cols = peak_columns(targets, flat.shape[1], gen).to(flat.device)
    z = flat.float()
    height = peak_heights(z, temperature).clamp_max(torch.finfo(flat.dtype).max / 4)
    flat[torch.arange(flat.shape[0], device=flat.device), cols] = height.to(flat.dtype)


def place_weight_rows(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                      temperature: float, gen: torch.Generator) -> None:
    """Through the lm_head (fused linear): weight rows of the peak columns written so that hidden row r's logit
    at its column is its height. Where the rows are independent (R <= H) the new weight rows are solved so
    each row's peak column gives every other row a logit of 0 (float64 Gram solve); else each is hidden row r
    scaled, whose logits at the other rows' columns land wherever they land (a row's largest logit is then one of
    the peak columns, at least its own height). Whichever keeps at least half of every row's margin once rounded
    into the weight's dtype (a near-singular solve may not)."""
    h = hidden.reshape(-1, hidden.shape[-1]).double()
    cols = peak_columns(targets.reshape(-1), weight.shape[0], gen).to(weight.device)
    z = (h @ weight.double().T) + (0.0 if bias is None else bias.double())
    height = peak_heights(z, temperature)
    own = height - (0.0 if bias is None else bias.double()[cols])
    rows = h.shape[0]
    gram = h @ h.T
    tries = [own[:, None] * h / gram.diagonal().clamp_min(1e-300)[:, None]]
    if rows <= h.shape[1]:
        solved = torch.linalg.solve_ex(gram, torch.diag(own))
        if int(solved.info.max()) == 0:
            tries.insert(0, solved.result.T @ h)  # w_r . h_s = own_r * [r == s]
    top = z.amax(-1)
    for w in tries:
        rounded = w.to(weight.dtype)
        got = (h * rounded.double()).sum(-1) + (0.0 if bias is None else bias.double()[cols])
        if bool((got - top >= 0.5 * (height - top)).all()):  # rounding kept at least half the margin
            weight[cols] = rounded
            return
    raise AssertionError("no peak weight rows kept half their margin once rounded")  # the projection always does
