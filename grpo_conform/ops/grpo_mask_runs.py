"""The mask-runs probe (the thirty-sixth session's logits round): a shape of its own whose first call keeps every
token, then calls at that shape whose live rows hold long padding runs.

Two accepted kernels showed what the drawn masks never held:
- a kernel variant built once per shape (a CUDA graph captured, a kernel compiled) with "has padding" taken from
  the first call's mask, so that a shape first met unpadded ignores the mask ever after. Every shape's first call
  was padded: the drawn layouts rotate so each set holds a padded row (tests/gallery/mask-specialised-at-first-call-
  per-shape). A trainer meets it whenever the first micro-batch at a length ran every completion to it;
- a kernel summing a sequence's log-ratio from per-tile partials (256 positions) in a reused workspace, skipping
  the write of a tile with no kept token, so a live row with a padded tile adds an earlier call's partial. No live
  row ever had a padding run of 256+ positions: the masked workloads hold at most 72 positions, reach's long rows
  keep 3/4 of theirs (tests/gallery/seq-is-tile-partials-skip-padded-tiles).

The runs come from the mask input's declared semantics (0 marks padding anywhere in a row: right, left, interior),
not from either kernel: every run is RUN positions or more, so it covers a whole aligned tile of up to RUN / 2 and
one of RUN where it starts at a tile boundary (a multiple of RUN), which half the runs do.
"""

from __future__ import annotations

import random

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, PLAIN, Probe, WorkloadConformance
from grpo_conform.checks.shaped import at_shape
from grpo_conform.ops.grpo_logits.generators.knots import clear_of_knots
from grpo_conform.ops.grpo_logits.member_inputs import audible
from grpo_conform.ops.grpo_probes import mask_input

RUN = 256  # the least padding run: a tile of 256 positions (Liger's and TRL's Triton blocks), aligned or not
RUN_SPAN = (RUN, RUN + 64)  # a run's drawn length
SEQ = (RUN + RUN_SPAN[1] + 24, RUN + RUN_SPAN[1] + 88)  # room for a run starting at 256 and kept tokens after
#: the rows' layouts, one row each: a run starting at a tile boundary inside the completion, the completion ending
#: at one (the rest padding), the completion ending at two tiles (2 RUN: every tile of up to 2 RUN after it padded),
#: left padding, and a run at a drawn start. Two trailing rows a call: a row whose sequence the clip binds hides a
#: stale partial that keeps it clipped, and a gallery kernel with 512-position tiles, whose only padded tiles are the
#: trailing rows', passed once in ~80 runs with one (CI run 204)
LAYOUTS = ("interior-at-tile", "trailing-at-tile", "trailing-at-two-tiles", "leading", "interior-drawn")
PADDED_CALLS = ("MR", "MR-2")  # two padded sets: each live row's stale-partial error crosses the cap about half the time
FAR_SHIFT = (0.5, 1.5)  # a call's per-row shift of its log-ratios (`far_ratios`)
VOCAB_CPU = (33, 47)  # on the CPU the rows cost what the vocabulary does; a tile over positions does not depend on it


def run_row(layout: str, seq: int, r: random.Random) -> torch.Tensor:
    """One live row of `seq` positions holding a padding run of RUN_SPAN positions as `layout` says."""
    keep = torch.ones(seq, dtype=torch.bool)
    n = r.randint(*RUN_SPAN)
    if layout == "interior-at-tile":
        keep[RUN : RUN + n] = False
    elif layout == "trailing-at-tile":
        keep[RUN * r.randint(1, (seq - RUN) // RUN) :] = False
    elif layout == "trailing-at-two-tiles":
        keep[2 * RUN :] = False
    elif layout == "leading":
        keep[:n] = False
    else:
        start = r.randint(1, seq - n - 1)
        keep[start : start + n] = False
    return keep


def far_ratios(run: WorkloadConformance, inp, keep: torch.Tensor, r: random.Random) -> list[str]:
    """Every call's per-token log-ratios moved far from 0 tile by tile, by input kind (never by member): in each row
    a drawn shift d in FAR_SHIFT, +d over the first half of the row's kept positions and -d over the rest (sign drawn
    per row); log-probs move by it (kept <= 0), ratios are scaled by exp of it; and every per-sequence scalar (the
    advantages) `audible`: at least 0.25 in magnitude, signs kept. A tile's sum of a per-position log quantity is
    then large (a tile inside one half sums d per position) while a row's sum over its kept tokens stays where it was drawn
    (near 0: the sequence's ratio stays unclipped, a vLLM sequence ratio finite), so a call that adds an earlier
    call's stale partial is off by far more than any tolerance, and no row's gradient is 0 whatever its ratio (a
    zero advantage hid the stale row). With the drawn near-on-policy values alone a stale GSPO partial moved the
    sequence's mean log-ratio by ~1e-3, inside the tolerance unless it crossed a clip
    bound (a gallery kernel summing GSPO from 512-position partials, at 61b419a, passed gradient 4 runs in 10;
    with these moves 0 in 24). The moves ignore the member's knots, so `clear_of_knots` then keeps every live ratio
    the member judges against one `boundary_margin` from it, as the drawn sets are. The names it moved."""
    order = torch.cumsum(keep.to(torch.int64), dim=-1)  # 1-based rank of each kept position in its row
    n = keep.sum(-1, keepdim=True)
    # +1 over the first half of the row's kept positions, -1 over the second, 0 at an odd row's middle one: every
    # row's sum stays as drawn (an odd row's moved by d put vLLM's sequence product up to e^1.5 from its draw)
    sign = torch.where(order * 2 <= n, 1.0, torch.where(keep & (order * 2 == n + 1), 0.0, -1.0)).to(torch.float64)
    moved = []
    for name in (t.name for t in run.spec.inputs if t.name in inp.tensors):
        t, kind = inp.tensors[name], run.op.input_kind(name)
        if kind == "sequence-scalar":
            t.copy_(audible(t))
        elif kind in ("token-logprobs", "token-ratio") and tuple(t.shape) == tuple(keep.shape):
            wide = t.to(torch.float64)  # only these: a float64 copy of the logits would be a logits-sized waste
            d = torch.tensor([r.uniform(*FAR_SHIFT) * r.choice((-1.0, 1.0)) for _ in range(t.shape[0])],
                             dtype=torch.float64)
            shift = (d[:, None] * sign).to(t.device)
            moved_to = (wide - shift).clamp(max=0.0) if kind == "token-logprobs" else wide * torch.exp(shift)
            t.copy_(moved_to.to(t.dtype))
        else:
            continue
        moved.append(name)
    if moved:
        # the moves ignore the member's knots (a ratio 6e-6 from a clip bound failed an honest kernel): clear them
        params, key = run.model.params, run.slot_key(inp)
        compute = lambda: run.op.policy_logprobs(run.spec, inp.tensors, params)  # noqa: E731
        # the logits' log-probs: the generator seeded the cache with them, and the moves leave the logits as they are
        cached = key is not None and "logits" in inp.tensors
        logp = run.refs.logp(key, run.model.temperature, compute) if cached else compute()
        clear_of_knots(inp.tensors, params, run.spec.validation.member_inputs.boundary_margin, logp, keep)
        inp.commit()
        if cached:  # the committed version's log-probs are the same: the judge need not compute them again
            run.refs.seed_logp(run.slot_key(inp), run.model.temperature, logp)
    return moved


def mask_runs(run: WorkloadConformance) -> None:
    """MR-full, then MR and MR-2, at a shape of their own drawn from the run's secret seeds (5 rows, seq SEQ: never
    a workload's, reach's or trainer-shaped's, never announced to the compile-ahead worker): MR-full keeps every
    token, so it is that shape's first call in the worker and unpadded; MR and MR-2 (fresh sets) give each row one
    LAYOUTS run of 256+ positions, rows shuffled. All judged as plain calls (loss, gradient, masked positions at
    exactly 0). Once per worker process and member with a mask (a per-shape cache or a tile's skipped write is a
    property of the code); on the fused operation on CUDA only: interpreted on the CPU its ~2,500 rows a call
    cost ~9 s a member.

    How a hostile kernel passes it: by keying on the shape (5 x ~630 at a vocabulary of 33-47 on the CPU) or on a
    first call that keeps every token at a shape it then sees padded, which is what a trainer's first full-length
    micro-batch is; by specialising on a later call than the first (a second unpadded call is never made); or with
    tiles of 1024+ (a row of SEQ positions is one such tile)."""
    mask = mask_input(run)
    if mask is None or run.made_in("mask_runs") is not None:
        return
    if run.op.name != "grpo-logits" and run.device.type != "cuda":
        run.draws["mask_runs"] = {"skipped": f"{run.op.name} on the CPU: ~2,500 interpreted rows a call"}
        return
    r = random.Random(run.seeds[0] ^ 0x3A5C)
    seq = r.randint(*SEQ)
    free = [a.name for a in run.spec.axes if a.derivation() is None]
    axes = {**{a: run.rw.axes[a] for a in free}, "batch": len(LAYOUTS), "seq": seq}
    if run.device.type != "cuda":
        axes["vocab"] = r.randint(*VOCAB_CPU)
    drawn: dict = {"seq": seq, "vocab": axes["vocab"], "calls": []}
    run.draws["mask_runs"] = drawn
    with at_shape(run, "MRP", "MRO", axes) as (inp, out):
        for i, label in enumerate(("MR-full",) + PADDED_CALLS):
            if label == "MR-full":
                keep = torch.ones(len(LAYOUTS), seq, dtype=torch.bool)
            else:
                layouts = r.sample(LAYOUTS, len(LAYOUTS))
                keep = torch.stack([run_row(name, seq, r) for name in layouts])
                drawn.setdefault("layouts", []).append(layouts)
            run.generate(inp, run.seeds[0] ^ 0x3A5D ^ (i << 20), given={mask: keep})
            drawn["far"] = far_ratios(run, inp, keep, r)
            call = run.call(label, inp, out, PLAIN, keep=False)
            if call is None:
                return
            drawn["calls"].append({"label": label, "kept": int(keep.sum())})
            J.plain(run, call)


def _has_mask(spec) -> str | None:
    from grpo_conform.ops import operation_for  # the registry imports the operations, which import nothing here

    kind = operation_for(spec).input_kind
    return None if any(kind(t.name) == "mask" for t in spec.inputs) else "no mask input: no padding runs to hold"


MASK_RUNS = Probe("mask-runs", mask_runs.__doc__, mask_runs, PLAIN + CALL, applies=_has_mask)
