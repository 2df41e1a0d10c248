"""The `reach` probe: calls beyond the default workloads' shapes and dtypes, drawn from the declared domain.

A spec declares its axes with a lower bound only (batch >= 1, vocab >= 2, ...) and each input's dtypes, but
the workloads a default check runs on the CPU hold a narrow slice of that: batch <= 4, rows <= 72, vocab
<= 1536, hidden <= 48, one dtype. A kernel that is right only there (a mean of 4-row tile means, a sequence
ratio summed over its first 128 positions, an online log-sum-exp that never rescales across vocabulary
tiles, a float16 path that drops the temperature) passed every default check (the twenty-seventh session's
adversarial round: docs/checks.md). This probe makes the reach mechanical:

- one call per free axis (no declared maximum), that axis past REACH_FLOOR (the sizes where kernels switch
  tiles, index widths or paths; on CUDA rows past a grid dimension's 65535) and past twice the largest value
  the member's default workloads on this device use (at most REACH_CAP), odd and off every power of two, the
  other axes small, but the rows call holds two or three sequences (a kernel mixing sequences up is exact at
  batch 1; two of 1089+ rows for the fused operation on the CPU, whose interpreted kernel pays per row) and the
  batch call 1-2 positions a sequence (REACH_LEAD_SMALL);
- the vocabulary call's rows each peak (`spread_peaks`): a planted largest logit clear of the rest of its row,
  the rows' peaks spread over the vocabulary, so an online log-sum-exp that never rescales is wrong on every
  row whose peak lies outside the first region it reads, whatever its order, not only on the draws that raise a
  row's maximum late and by much;
- each token kept with probability 3/4 (every tile keeps tokens, the mask varies along a long row), each call
  backpropagating an upstream scalar of another kind, half of them through torch.autograd.grad;
- the calls take in turn each dtype the differentiable input declares that no default workload of the
  member on this device uses (the inputs that declare the same dtypes follow it), then its own, starting at the
  member's turn (`member_calls.member_turn`: its family index plus the run's number), which turns the upstream kinds
  too: no call keeps one upstream kind, and no free axis one dtype for every member and run, but the rows call
  (float32, `member_calls.ROWS_FIXED`), where a long-row bug too small for half precision shows;
- for the fused operation on the CPU, which has no seq-aligned call, a second rows call in half precision
  (`member_calls.rows_half_axes`: bfloat16 and float16 in turn), so long rows meet both precisions in every run;
- a wide-vocabulary call, in the member's own dtype, past 2^18 (`member_calls.wide_axes`: 262145-278527, 4-6
  rows; Gemma 3 runs 262208, and the vocabulary call stays in (2^17, 2^18]), at the workload's drawn temperature
  (never 1) and epsilons: a path past one block of 2^18 that drops 1/T in backward passed every call before
  (thirty-seventh session); not for the fused operation on the CPU (`member_calls.wide_applies` says why);
- a low call, the vocabulary 2-31 and the hidden size 1-7 (`member_calls.low_axes`), and where the wide call runs
  a vocabulary-blocks call, the vocabulary a multiple of 2^16 (`member_calls.blocks_axes`), each once in every
  dtype the lead input declares: no other call's vocabulary was below 32 or a multiple of 65536, and float32 or
  float16 never met a vocabulary past 65536 (forty-second session's red team);
- a seq-aligned call, each of 2-3 sequences 256 x 2..8 positions, its mask sparse (1/8 kept, the last sequence
  empty), where the wide call runs (`member_calls.seq_aligned_axes`);
- a call, in the member's own dtype, at aligned sizes (`member_calls.aligned_axes`): rows 128, vocabulary
  and hidden multiples of 512-4096 (logits: 4096-32768) and 64-512. Every size above is odd, so a kernel whose
  last tile is `size % TILE` wide, dropping a full tile when TILE divides the size (real models' V 32768, 128256,
  H 2048-8192), passed every CPU call (thirty-sixth session).

Once per worker process and member, like repeated-calls: what it looks for is a property of the code, not
of one workload. Each call is judged in full against the reference; one finding for all of them. The shapes
are drawn per member from a secret of the process (member_calls.py), so the slot's compile-ahead worker
compiles their kernels before the member's first workload calls them; one call, chosen when the probe runs, is
drawn from the workload's own generator instead, so that no kernel can be right only where it was shown.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.checks.shaped import at_shape
from grpo_conform.compare import describe_outputs
from grpo_conform.checks.upstreams import RANGE_MARGIN, draw_upstream, gradient_bound, room
from grpo_conform.dtypes import torch_dtype
from grpo_conform.checks import member_calls
from grpo_conform.ops.grpo_probes import REACH_AUTOGRAD, REACH_BLOCK_PROFILES, REACH_SPREAD_PEAKS, mask_input
from grpo_conform.ops.grpo_views import audible_call

CHECK = "reach"


#: the upstream scalar of each reach call, in turn from the member's turn (`member_calls.member_turn`), of each kind
#: `upstream` draws (a kernel switching to a large-input path scaled only some gradients by it)
REACH_UPSTREAM = ("negative", "tiny", "large", "fraction")
SHORT_ROW = 2  # rows of at most this many positions keep no token by rule (`reach_mask`)
SPARSE = 0.125  # the share the seq-aligned call's mask keeps (`reach_mask`'s `sparse`)
KEPT = 0.75  # the share of tokens a reach call's mask keeps, drawn per token (see `reach_mask`)
NARROW = 1e6  # a gradient dtype whose largest finite value is below this (float16) has its range checked
REDRAWS = 8  # draws of a reach call's values tried before its range is an internal error
REDRAW_SALT = 0x52414E47


def reach_mask(shape: tuple[int, ...], dtype: torch.dtype, seed: int, sparse: bool = False) -> torch.Tensor:
    """Each token kept with probability KEPT, and each row's last token too where rows are longer than
    SHORT_ROW: a long row keeps tokens in every tile (a left-padded row of 261 positions keeping 40 tested nothing
    past the first tile), and the mask varies along it, so one read at the wrong position (t % 1024) shows.

    Short rows (the batch call's 1-2 positions) are drawn freely, some of them empty: forcing their last token kept
    made the fused operation's batch call (one position a sequence) keep every token, and a normaliser computed per
    chunk of 4 sequences was then exact wherever the batch divided by 4 (a CI run at 2e13295; docs/checks.md, "The
    reach mask"). The mask is never uniform: it keeps one token at least and drops one where it has two or more.

    `sparse` (the seq-aligned call): each token kept with probability SPARSE and the last sequence empty, a padded
    micro-batch whose longest completion is not its last: a packed path for sparse batches that counted the
    sequences from the kept tokens' row ids dropped trailing empty rows from the batch mean and passed every
    default run (forty-second session's red team, `packed-sparse-trailing-empty-rows`)."""
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(shape, generator=gen) < (SPARSE if sparse else KEPT)
    if shape[-1] > SHORT_ROW:
        keep[..., -1] = True
    if sparse and shape[0] > 1:
        keep[-1] = False
    flat = keep.view(-1)
    if not flat.any():
        flat[-1] = True
    elif flat.all() and flat.numel() > 1:
        flat[int(torch.randint(flat.numel() - 1, (), generator=gen))] = False
    return keep.to(dtype)


def reach(run: WorkloadConformance) -> None:
    """One call per free axis past the default workloads' sizes (REACH_FLOOR), each in a declared dtype no
    default workload uses where one is left; every call judged against the reference."""
    made_in = run.made_in("reach")
    if made_in is not None:
        run.book.not_applicable(CHECK, f"made once per worker process: its calls ran in workload {made_in}")
        return
    # what compile-ahead compiled, but for one call drawn from this workload's generator (member_calls.py says why)
    calls = member_calls.reach_calls(run.spec, run.device.type, run.grad_dtype, run.rng)
    shown = member_calls.reach_calls(run.spec, run.device.type, run.grad_dtype)
    bad: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    base = run.seeds[-1] ^ 0x5EAC4ED
    try:
        for i, (lead, axes, dtype) in enumerate((c.lead, c.axes, c.dtype) for c in calls):  # one per free axis
            wanted = member_calls.with_dtype(run.spec, run.rw.workload, dtype)
            with at_shape(run, f"RH{i}", f"RO{i}", axes, wanted, dtype) as (inp, out):
                what = {"lead": lead, "axes": axes, "dtype": dtype, "announced": calls[i] == shown[i]}
                done.append(what)
                started = time.perf_counter()
                why = _reach_call(run, i, lead, inp, out, base, what)
                # each call's wall seconds (draw, worker round trips, judgment): where a GPU run's reach time goes
                what["seconds"] = round(time.perf_counter() - started, 3)
                if why is None:
                    return
                if why:
                    bad.append({**what, "why": why})
    finally:
        run.draws["reach"] = done
    said = "; ".join(f"{d['call']} {_shape_text(d['axes'])} {d['dtype']}{_aligned(d)}" for d in done)
    first = bad[0] if bad else None
    what = "calls past the default workloads' sizes or aligned"
    run.book.record(CHECK, "R1..R%d" % len(done), not bad,
                    f"{len(done)} {what} match the reference: {said}" if not bad else
                    f"{len(bad)} of {len(done)} {what} do not match the reference; first {first['call']} at "
                    f"{_shape_text(first['axes'])} in {first['dtype']}{_aligned(first)}: {first['why']}",
                    {"calls": done, "failing": bad[:10]})


def _aligned(call: dict[str, Any]) -> str:
    return " (aligned: every axis a multiple of a large power of two)" if call["lead"] == member_calls.ALIGNED else ""


def _reach_call(run: WorkloadConformance, i: int, lead: str, inp, out, base: int, what: dict[str, Any]) -> str | None:
    """Reach call i, the run set to its shape (`shaped.at_shape`), `what` filled in with how it was made: "" where it
    matches the reference, why not where it does not, None where the worker failed (recorded against the check)."""
    mask = mask_input(run)
    sparse = lead == member_calls.SEQ_ALIGNED
    given = {mask: reach_mask(inp.tensors[mask].shape, inp.tensors[mask].dtype, base + i, sparse)} if mask else None
    peaks = lead in REACH_SPREAD_PEAKS
    kind = REACH_UPSTREAM[(i + member_calls.member_turn(run.spec)) % len(REACH_UPSTREAM)]  # no lead keeps one kind
    c = draw_upstream(run, kind, record=False)
    profiles = REACH_BLOCK_PROFILES if lead == member_calls.BLOCKS else None
    x, c = _in_range(run, inp, base + i, given, peaks, kind, c, what, profiles)
    inp.publish()
    run.op.keep_generated(inp.pristine, x)
    # the generator's float64 log-probs of exactly these values: the judgment does not compute them again
    run.refs.seed_logp(run.slot_key(inp), run.model.temperature, getattr(x, "logp", None))
    label = run._label(f"R{i + 1}")
    method = "autograd.grad" if lead in REACH_AUTOGRAD else "backward"
    # the workload's drawn parameters (temperature away from 1): a path that drops 1/T is exact at T = 1
    what.update({"call": label, "upstream": c, "method": method, "spread_peaks": peaks,
                 "temperature": run.model.values.get("temperature")})
    f = run.forward(label, inp, (CHECK,))
    if f is None:
        return None
    finished = run.backward_export(label, inp, out, (CHECK,), f, c, method, None, keep=False)
    if finished is None:
        return None
    skipped, exported = finished
    run.book.record("runs", label, True, "every call returned")
    run.mutation(label, inp, {"forward": f["forward"], "backward": inp.changes()})
    report = exported["report"]
    call = Call(label, inp, c, float(out.loss[0]), report.get("loss"), report.get("grads") or {}, out.grads,
                skipped.get(label))
    if call.missing:
        return call.skipped_backward or "no gradient"
    loss_cmp, cmp = run.judge(call)
    return "" if loss_cmp.passed and cmp.passed and cmp.nan == 0 else describe_outputs(loss_cmp, cmp)

class ReachRangeError(RuntimeError):
    """No redraw of a reach call kept its reference gradient inside its dtype's range: a bug of the generators
    (an internal error: the workload's checks are reported not judged)."""


def _in_range(run: WorkloadConformance, inp, seed: int, given, peaks: bool, kind: str, c: float,
              what: dict[str, Any], profiles: tuple[str, ...] | None = None) -> tuple[Any, float]:
    """The call's inputs drawn into `inp.pristine` and its upstream scalar, such that c times the float64 reference
    gradient stays within 1/RANGE_MARGIN of the gradient dtype's finite range. Only float16's range is narrow
    enough to matter (bfloat16 and wider share float32's exponents). An honest float16 kernel cannot return a
    gradient past 65504: the eager fused peer returned Inf there, the correctly rounded value, and failed reach
    (a CI run: hidden 9, vocabulary 139265, a reference hidden gradient of -3e6). A large upstream is cut to the
    largest power of two that fits (never below 1); values that do not fit are redrawn (`what["redrawn"]`)."""
    top = torch.finfo(torch_dtype(run.grad_dtype)).max
    for k in range(REDRAWS):
        drawn = seed if k == 0 else seed ^ (k * REDRAW_SALT)
        x = run.op.generate(run.spec, run.rw, drawn, run.device, out=inp.pristine, values=run.model.values,
                            given=given, spread_peaks=peaks, profiles=profiles)
        heard = audible_call(run, inp.pristine, _generated_logp(x), drawn)  # before the range: |A| moves the gradient
        if heard:
            what.update(heard)
        if top > NARROW:
            return x, c
        fits = room(gradient_bound(run, inp), top)
        if kind == "large" and 1.0 <= fits < math.inf:  # inf: an all-zero reference gradient, any upstream fits
            c = min(c, 2.0 ** math.floor(math.log2(fits)))
        if abs(c) <= fits:
            if k:
                what["redrawn"] = k
            return x, c
    raise ReachRangeError(f"{REDRAWS} draws of reach's {run.grad_dtype} call at {_shape_text(run.rw.axes)} all had "
                          f"a reference gradient past 1/{RANGE_MARGIN} of the dtype's range at upstream {c:g}")


def _generated_logp(x: Any) -> torch.Tensor | None:
    """The float64 policy log-probs the generator computed of its values, where it did (the logits operation's
    `logp`, the fused one's row pass): none computed again."""
    rows = getattr(x, "rows", None)
    return getattr(x, "logp", None) if rows is None else rows.logp


def _shape_text(axes: dict[str, int]) -> str:
    return "(" + ", ".join(f"{k} {v}" for k, v in axes.items()) + ")"
