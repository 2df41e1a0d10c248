"""Small-|A| sequences judged on a token that carries a gradient (kind `token-logprobs`, token level).

A sequence's gradient is the sum of its kept tokens' s * (onehot - p), each 0 where the clip binds and ~0 where
the row is near one-hot (p_t ~ 1). A sequence of small |A| (`generators.advantages`: tiny, exact-tiny) exists to be
judged (a kernel cutting off or rescaling small advantages), so it must hold a kept token with neither: else an
honest gradient and a wrong one are both ~0. Two draws see to it. The logits (`inputs._resolvable_rows`): not
every kept row of such a sequence peaked. The ratios (`one_judged_token`, here): if no kept token of 1 - p_t >=
AUDIBLE_GAP has its ratio in the band around 1 (unclipped under every clip rule), the kept token of least p_t is
moved into that band (swapped with a band token's ratio where the row has one). Without it, batch-one-shortcut (the advantage replaced by its sign at batch 1) passed
`gradient` on call A of mask-b1-long in ~0.37% of draws (11 of 3000): two kept tokens, one clipped and the other
near one-hot (clean-clone CI run, 2026-12-07; docs/checks.md).

Sequence level (`free_one_sequence`): each sign's first sequence sits where that sign's clip binds, which makes a
whole call's gradient exactly 0 where every judged sequence is such a first one: every batch-1 set, and every
drawn batch-2 set (one sequence of each sign). sequence-batch-one-shortcut passed `gradient` on every such call.
VESPO's small weights were examined and are judged row by row: not a blind spot (docs/checks.md).
"""

from __future__ import annotations

import math

import torch

from grpo_conform.ops.grpo_logits.generators.advantages import SMALL_MAX

AUDIBLE_GAP = 1e-2  # least 1 - p_t of the judged token: 1000x the gradient allowance's absolute floor (1e-5 s)
_SALT = 0x4A0D6ED  # the band's draw: a stream of its own, so every other draw of the set stays as it was


def small_rows(advantages: torch.Tensor) -> torch.Tensor:
    """[batch] bool: the sequences of small, non-zero |A| (the cases generators.advantages places)."""
    a = advantages.detach().reshape(-1)
    return (a.abs() <= SMALL_MAX) & (a != 0)


def middle_band(intervals: list[tuple[float, float]]) -> int | None:
    """The ratio interval holding 1 (between 1 - eps_low and 1 + eps_high: no clip binds there), if any."""
    for k, (lo, hi) in enumerate(intervals):
        if lo <= 1.0 <= hi:
            return k
    return None


def one_judged_token(log_r: torch.Tensor, logp: torch.Tensor, keep: torch.Tensor, advantages: torch.Tensor,
                     intervals: list[tuple[float, float]], seed: int, held: dict[int, tuple[int, int]]) -> torch.Tensor:
    """`log_r` [B, S] (float64, on logp's device) with, in each small-|A| row lacking one, a judged token: a
    kept token of 1 - p_t >= AUDIBLE_GAP whose ratio lies in the middle band. The row's kept token of least p_t
    (never a `held` binding position) takes the ratio of a kept token in the band, which takes its ratio in turn
    (the row's regions stay as drawn), or a fresh one log-uniform in the band where no kept token is there.
    Nothing waits for the device."""
    band = middle_band(intervals)
    small = small_rows(advantages.to("cpu"))
    if band is None or not bool(small.any()):
        return log_r
    device, (batch, seq) = logp.device, log_r.shape
    lo, hi = (math.log(x) for x in intervals[band])
    gen = torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1))
    fresh = _to(lo + torch.rand(batch, generator=gen, dtype=torch.float64) * (hi - lo), device)
    free = keep.clone()
    for row, (pos, _) in held.items():
        free[row, pos] = False
    keep, free, lp = _to(keep, device), _to(free, device), logp.to(torch.float64)
    audible, in_band = -torch.expm1(lp) >= AUDIBLE_GAP, (log_r >= lo) & (log_r <= hi)  # 1 - p_t; unclipped
    pick = torch.where(free, lp, torch.full_like(lp, math.inf)).argmin(-1, keepdim=True)  # the least p_t
    fix = _to(small, device) & ~(keep & audible & in_band).any(-1) & (free & audible).gather(-1, pick).squeeze(-1)
    swap = free & in_band
    other = swap.to(torch.int8).argmax(-1, keepdim=True)  # the row's first free kept token in the band
    has_other = swap.any(-1)
    r_pick, r_other = log_r.gather(-1, pick), log_r.gather(-1, other)
    at = torch.arange(seq, device=device)[None, :]
    out = torch.where((at == other) & (fix & has_other)[:, None], r_pick, log_r)
    return torch.where((at == pick) & fix[:, None], torch.where(has_other[:, None], r_other, fresh[:, None]), out)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # from pinned memory: a pageable copy to a GPU waits for the generation queued before it
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


_LIVE_SALT = 0x11FE5E0  # the freed sequence's draws: a stream of their own, as _SALT


def turn(case: int | None, gen: torch.Generator) -> int:
    """0 or 1, alternating over a workload's sets (`case` 0, call A: 0), the parity turned every 4 sets so that each
    of batch 1's advantage kinds (generators.advantages: tiny, ordinary, exact-tiny, 1/G, period 4) meets both; a
    coin from `gen` where `case` is None."""
    if case is None:
        return int(torch.randint(0, 2, (1,), generator=gen))
    return (case + case // 4) % 2


def free_one_sequence(which: torch.Tensor, advantages: torch.Tensor, judged: torch.Tensor, k: int,
                      leads: dict[int, int], case: int | None, seed: int) -> torch.Tensor:
    """`which` ([batch] interval indices of the sequences' ratios, of `k` intervals: the top one binds the clip for
    A > 0, the bottom one for A < 0) with, where no `judged` sequence (A != 0, a kept token) lies outside its
    sign's binding interval, one moved to a drawn other interval (unclipped for its sign, so a gradient to judge).
    Which: a judged sequence that is not its sign's first (`leads`) if any; else with both signs' firsts judged
    (a drawn batch of 2), the first of the sign `turn` names (the other keeps the clip bound in the call); else (one
    judged sequence: batch 1) the first on the sets `turn` gives 0, call A's among them: the others keep the clip
    bound, so a kernel dropping the clip only at batch 1 still meets a call where it binds."""
    a = advantages.detach().cpu().double().reshape(-1)
    binding = torch.where(a > 0, torch.full_like(which, k - 1), torch.zeros_like(which))
    judged = judged.cpu() & (a != 0)
    if k < 2 or not bool(judged.any()) or bool((judged & (which != binding)).any()):
        return which
    gen = torch.Generator().manual_seed((seed ^ _LIVE_SALT) & (2**63 - 1))
    t = turn(case, gen)
    rows = torch.nonzero(judged).flatten().tolist()
    others = [row for row in rows if row not in leads.values()]
    if others:
        row = others[0]
    elif len(rows) == 2:  # the two signs' firsts
        row = leads[1 if t == 0 else -1]
    elif t == 0:
        row = rows[0]
    else:
        return which
    choices = [i for i in range(k) if i != int(binding[row])]
    out = which.clone()
    out[row] = choices[int(torch.randint(0, len(choices), (1,), generator=gen))]
    return out
