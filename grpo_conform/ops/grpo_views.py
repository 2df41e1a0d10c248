"""The layouts probe's input set (V: every input an offset, strided view of a padded buffer) drawn so that every
row of it reaches the loss and the gradient audibly.

A kernel that walks a strided input at the pitch of a contiguous tensor (rows `vocab` apart, sequences
`(seq + 1) * vocab` apart, from the data pointer) reads every row but the first wrongly, and a call shows that
only where those rows count. The ordinary sets promise no such thing: the float16 pass's V (other-dtypes, at the
smallest workload: one sequence) had the mask rotation's `single` layout, one kept token, and where its ratio
sat in a region where the clip binds (loss flat, gradient 0) a wrong read that pushed the ratio further out
changed nothing (gallery fp16-rows-at-vocab-pitch passed about 1 run in 8). At sequence level the generators put
the first sequence of each advantage sign where the clip binds, which in a batch of one is the whole call.

So V is drawn with (`draw_views`):
- a mask (members with one) keeping at least 2/3 of every row: one masked run a row, as left or right padding
  or a hole, one row of two or more unpadded (`view_mask`); no single token, no empty row but the edge rows';
- every advantage `audible` (at least 0.25 in magnitude, signs kept);
- at token level the drawn old log-probs (every row's blocks of positions span every clip region, so about a
  third of a row's kept tokens are live on either sign); at sequence level each sequence's ratio moved into the
  region holding r = 1, unclipped for every clip and inside CISPO's cap, and for VESPO each sequence's sum of
  log-ratios near its weight's peak, by shifting that row's old log-probs (`live_sequences`).
Edge rows (`edge_rows`): from batch 2 on, up to batch // 2 rows (row 0 at batch 2, so that row 1, which a wrong
batch pitch misreads, stays audible) take what the rows above exclude, one kind each, from those the member's
inputs allow (`edge_kinds`): an empty row, a single kept token (mask members), a sequence left where the generator
drew it, its clip often binding (sequence level and VESPO), a zero advantage on a row of ordinary kept tokens
(every member). Where a set holds fewer edges than kinds, the strided calls of a run take the kinds in turn (L
turn 0, FZV 1, L2 in the other dtypes 1, 2): each kind meets a strided call. A kernel with a second path for
strided inputs (a staging copy, a gather) that mishandles such a row would otherwise pass every call: the other
probes draw these rows on contiguous inputs only (gallery strided-mean-over-nonempty-rows: a staging path that
left empty rows out of the batch mean passed the whole default check before). Batch-1 calls keep their one row
audible.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from grpo_conform.ops.grpo_logits.member_inputs import audible, ratio_intervals
from grpo_conform.ops.grpo_logits.reference import GrpoParameters
from grpo_conform.ops.grpo_probes import mask_input

KEPT = 2 / 3  # the least fraction of every row the mask keeps


def edge_kinds(masked: bool, sequence_level: bool) -> tuple[str, ...]:
    """The edge rows a member's inputs allow: an empty row and a single kept token need a mask; a sequence left
    where the generator drew it (its clip often binding) differs from the live ones only at sequence level; a zero
    advantage (a group whose rewards tie) every member has."""
    return (("empty", "single") if masked else ()) + (("clipped",) if sequence_level else ()) + ("zero",)


def edge_rows(batch: int, kinds: tuple[str, ...], r: random.Random, turn: int = 0) -> dict[int, str]:
    """{row: kind}: n = min(len(kinds), batch // 2) rows at drawn places (row 0 at batch 2), their kinds the n after
    `turn * n` in `kinds`, cyclically: the strided calls of a run (L, then L2 in each other dtype: `turn` 0, 1, 2)
    take the kinds in turn, so each kind meets a strided call where a set of four rows holds only two edges."""
    n = min(len(kinds), batch // 2)
    rows = [0] if batch == 2 and n else r.sample(range(batch), n)
    return {row: kinds[(turn * n + i) % len(kinds)] for i, row in enumerate(rows)}


def view_mask(batch: int, seq: int, r: random.Random, edges: dict[int, str] | None = None) -> torch.Tensor:
    """[batch, seq] bool: each row keeps all but one run of at most seq/3 positions (left or right padding, or
    an interior hole), so every row holds at least ceil(2 seq / 3) kept tokens, and where two or more rows are
    not edges one of them keeps all; an `edges` row of kind "empty" keeps none, one of kind "single" keeps one
    position."""
    keep = torch.ones(batch, seq, dtype=torch.bool)
    rest = [b for b in range(batch) if b not in (edges or {})]
    full = r.choice(rest) if len(rest) >= 2 else None  # a row keeping every position, beside a padded one
    for b in range(batch):
        kind = (edges or {}).get(b)
        if b == full:
            continue
        if kind in ("empty", "single"):
            keep[b] = False
            if kind == "single" and seq:
                keep[b, r.randrange(seq)] = True
            continue
        n = r.randint(0, int(seq * (1 - KEPT)))
        where = r.choice(("right", "left", "hole")) if n and seq - n >= 2 else "right"
        start = {"right": seq - n, "left": 0}.get(where) if where != "hole" else r.randint(1, seq - n - 1)
        keep[b, start: start + n] = False
    return keep


def live_interval(p: GrpoParameters, cfg: Any) -> tuple[float, float]:
    """The drawn ratio interval holding 1, else the nearest to it (`ratio_intervals`: boundary_margin from every
    bound): between the clip bounds for a clip, below CISPO's cap where it exceeds 1, where SAPO's gate is steepest."""
    return min(ratio_intervals(p, cfg), key=lambda iv: max(math.log(iv[0]), -math.log(iv[1]), 0.0))


def live_sequences(old: torch.Tensor, logp: torch.Tensor, keep: torch.Tensor, advantages: torch.Tensor,
                   p: GrpoParameters, cfg: Any, r: random.Random,
                   left: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[float]]:
    """float64 old log-probs that put every sequence where its gradient is full, each row's old log-probs shifted by
    one constant (the tokens' spread around it kept): the sequence ratio (exp of the kept tokens' mean log-ratio)
    log-uniform in `live_interval`; for VESPO the kept tokens' sum u of log-ratios 1/4 to 3/4 from the peak
    log(k / lambda) of its weight phi(u) (either side: phi's slope is not 0 there, phi within ~1/3 of its peak),
    since with drawn k and lambda the generator's sums left phi ~1e-6, below float16's smallest normal in the
    gradient. Rows in `left` keep their drawn old log-probs. Returns them and the sequences' targets (mean log-ratio,
    or VESPO's sum; a `left` row's is its drawn one)."""
    kf = keep.to(torch.float64)
    n = kf.sum(-1).clamp_min(1.0)
    log_r = (logp.to(torch.float64) - old.to(torch.float64)) * kf
    if p.loss_type == "vespo":
        targets = []
        for a in advantages.tolist():
            k, lam = (p.vespo_k_pos, p.vespo_lambda_pos) if a >= 0 else (p.vespo_k_neg, p.vespo_lambda_neg)
            peak = math.log(max(k, 1e-6) / max(lam, 1e-4))
            targets.append(min(max(peak + r.choice((-1, 1)) * r.uniform(0.25, 0.75), math.log(1e-8) + 1.0), 19.0))
        target = torch.tensor(targets, dtype=torch.float64)
        shift = (log_r.sum(-1) - target) / n
    else:
        lo, hi = (math.log(v) for v in live_interval(p, cfg))
        target = torch.tensor([r.uniform(lo, hi) for _ in range(old.shape[0])], dtype=torch.float64)
        shift = log_r.sum(-1) / n - target
    for b in left:
        target[b] += shift[b] * (n[b] if p.loss_type == "vespo" else 1.0)
        shift[b] = 0.0
    return old.to(torch.float64) + shift[:, None], target.tolist()


def audible_scalars(run: Any, slot: Any) -> dict[str, torch.Tensor]:
    """`slot`'s per-sequence scalars (the advantages) `audible`, exact zeros kept but on rows of at most one kept
    token: for the one call of a pattern (forward-only, inference-mode, autocast), where a row of small |A| moves
    the loss by less than its allowance, and a zero on the single-token row hid that row (a drawn set may hold two
    zeros, more than `masks.zero_apart` can keep off the short rows: gallery
    autocast-single-token-rows-halved passed 4 runs in 40). Small advantages are the other calls' business; a
    zero on a row with tokens still counts in every normaliser."""
    x = slot.pristine
    mask = mask_input(run)
    short = (x[mask] != 0).sum(-1) <= 1 if mask is not None else None
    out = {}
    for n in (n for n in x if run.op.input_kind(n) == "sequence-scalar"):
        keep_zero = x[n] == 0 if short is None else (x[n] == 0) & ~short.reshape(x[n].shape).to(x[n].device)
        out[n] = torch.where(keep_zero, x[n], audible(x[n]))
    return out


def draw_views(run: Any, slot: Any, seed: int, turn: int = 0) -> dict[str, Any]:
    """Draw `slot` (the views) from `seed` as the module docstring says; what was drawn, for the workload's draws."""
    r = random.Random(seed ^ 0x51DE)
    mask = mask_input(run)
    batch, seq = run.rw.shapes["completion_ids"]
    p = GrpoParameters.from_spec(run.spec, run.model.values)
    sequence = p.ratio_over_sequence
    edges = edge_rows(batch, edge_kinds(mask is not None, sequence), r, turn)
    keep = view_mask(batch, seq, r, edges) if mask else torch.ones(batch, seq, dtype=torch.bool)
    run.generate(slot, seed, given={mask: keep} if mask else None)
    x = slot.pristine
    values = {n: x[n].clone() for n in x if run.op.input_kind(n) == "sequence-scalar"}
    for t in values.values():
        t.copy_(audible(t))
    for b, kind in edges.items():  # the zero edge row: A exactly 0 on a row of ordinary kept tokens
        if kind == "zero" and "advantages" in values:
            values["advantages"].view(-1)[b] = 0.0
    audible_rows = [b for b in range(batch) if b not in edges]
    drawn: dict[str, Any] = {"least_kept": int(keep[audible_rows].sum(-1).min()) if audible_rows else 0, "seq": seq,
                             "edge_rows": {str(b): k for b, k in sorted(edges.items())}}
    logp = None
    if sequence and "old_logprobs" in x:
        logits = "logits" in x
        compute = lambda: run.op.policy_logprobs(run.spec, x, run.model.params)  # noqa: E731
        # the logits operation's generator seeded the cache with these log-probs: no second pass
        logp = run.refs.logp(run.slot_key(slot), run.model.temperature, compute) if logits else compute()
        adv = values["advantages"].detach().to("cpu", torch.float64).reshape(-1)
        old, drawn["sequence_targets"] = live_sequences(x["old_logprobs"].cpu(), logp.cpu(), keep, adv, p,
                                                        run.spec.validation.member_inputs, r,
                                                        left=tuple(b for b, k in edges.items() if k == "clipped"))
        values["old_logprobs"] = old.to(x["old_logprobs"].device, x["old_logprobs"].dtype)
    slot.write(values)
    if logp is not None and "logits" in x:  # the logits did not change: the new version's log-probs are the same
        run.refs.seed_logp(run.slot_key(slot), run.model.temperature, logp)
    return drawn


def audible_call(run: Any, x: dict[str, torch.Tensor], logp: torch.Tensor | None, seed: int) -> dict[str, Any]:
    """A reach call's drawn set (`x`, written in place) made audible on every row: each advantage `audible`, and where
    the ratio is taken over a sequence every sequence `live_sequences` (its old log-probs shifted, `logp` the
    policy's float64 log-probs of these values at the run's temperature, computed here where None). As drawn, a
    sequence-level rows call (two sequences of 1089+) held one sequence where the clip binds and one of |A| ~ 0 in
    7 of 12 draws (forty-sixth session): its gradient was 0 to 1e-6 everywhere, so a long-row bug (a d hidden
    zeroed past row 1000, `fused-half-rows-dhidden-chunk-offset`) matched the reference. Small and zero advantages
    and clipped sequences are the ordinary sets' business; reach's is sizes. Returns what was drawn, in brief (a
    batch call holds 263+ sequences: their targets stay out of the evidence).

    How a hostile kernel passes it while wrong: by its values. Every reach call now has |A| >= 0.25 on every row, so
    a kernel wrong only at long rows with a small advantage present passes reach; on the CPU no other call holds
    more than 514 rows, so only CUDA's default workloads (1024+ rows, advantages as drawn) can catch it. That is a
    recognition of reach by value, the trade for calls that hear every row: before, a plain long-row bug passed
    whenever the draw was silent (most sequence-level draws)."""
    scalars = [n for n in x if run.op.input_kind(n) == "sequence-scalar"]
    for n in scalars:
        x[n].copy_(audible(x[n]))
    p = GrpoParameters.from_spec(run.spec, run.model.values)
    if not p.ratio_over_sequence or "old_logprobs" not in x or "advantages" not in x:
        return {}
    mask = mask_input(run)
    keep = (x[mask] != 0).cpu() if mask else torch.ones(x["old_logprobs"].shape, dtype=torch.bool)
    if logp is None:
        logp = run.op.policy_logprobs(run.spec, x, run.model.params)
    adv = x["advantages"].detach().to("cpu", torch.float64).reshape(-1)
    old, targets = live_sequences(x["old_logprobs"].cpu(), logp.cpu().reshape(keep.shape), keep, adv, p,
                                  run.spec.validation.member_inputs, random.Random(seed ^ 0xA0D1))
    x["old_logprobs"].copy_(old.to(x["old_logprobs"].device, x["old_logprobs"].dtype))
    return {"live_sequences": len(targets), "sequence_log_ratio_range": [round(min(targets), 6), round(max(targets), 6)]}
