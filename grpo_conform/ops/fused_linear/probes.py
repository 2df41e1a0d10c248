"""Probes of grpo-fused-linear's own (issue 31 item 3): how trainers hold the lm_head weight.

A trainer's weight is a parameter that lives across calls and is used more than once, which the
generic probes (one fresh leaf per call, `checks/probes.py`) never show:

- `grad-accumulation` (probe `accumulation`): every gradient buffer already holds a value when
  backward runs (gradient accumulation over micro-batches, a second loss term): one forward, a
  backward with upstream c1 and retain_graph=True, then a second `loss.backward` with c2 on the same
  leaves. Autograd accumulates: hidden.grad, weight.grad and bias.grad must hold (c1 + c2) times the
  reference. An implementation that overwrites (`weight.grad.copy_(new)`, `weight.grad = new`,
  clearing a buffer it believes stale) leaves c2 times it. c2 is drawn in [0.5, 1], c1 = r c2 with r
  in [1.8, 2.4]: the same sign (the bf16 sum of the two contributions keeps the relative precision the
  tolerance assumes), and every way to lose one contribution is at least 29% off (c2, c1 or 2 c2, as a
  reused scratch buffer gives, against c1 + c2); with c1 close to c2, 2 c2 hid in the bf16 allowance.
- `tied-weights` (probe `tied`): the weight is also the input embedding (tied embeddings, as in
  Gemma, Qwen2-0.5B, Llama-3.2-1B): the worker adds `s * embedding(ids, weight).sum()` to the loss
  before backward (`isolation/worker.py`, `_tied`), the ids being the batch's completion tokens
  (`tie_rows`: up to 64 lookups, rows whose reference scale is within 64x of the largest). Autograd sums both uses into weight.grad; the parent subtracts the embedding term's
  known gradient (s times each id's count, exact in bf16: s is a power of two, counts <= 64) and
  judges the rest against the reference. An implementation that sets weight.grad itself instead of
  returning the gradient through autograd loses the embedding's contribution (autograd runs the
  embedding's accumulation first). Where the rows' allowances are known (the operation's error
  model), s is a power of two that puts a lost term at >= 4 allowances of a tied row while the bf16
  rounding of the sum stays under half of one; the rows that admit the s most rows admit are tied, the
  others dropped (`tie_plan`). Otherwise s is the largest power of two at most 1/4 of the smallest
  reference scale of a tied row divided by its count: a lost contribution is then 1/8 of a row's scale
  or more, which hid inside a loose row tolerance in CI (gallery fused-grad-assigned, 2026-12-03).

Both also name the workload's odd sizes (rows, seq, vocab, hidden: `odd_sizes`) in the coverage's
`block_boundaries` category: the tiles' boundary masks of a blocked kernel are met only there (the CPU
tier's odd-bf16 has 21 rows, seq 7, vocab 1003; tests/test_fused_probes.py keeps it so).

- `model-slice` (probe NS, no check of its own: it feeds `non-leaf-logits`): hidden handed over as
  `out[:, :-1]` of a leaf `out` [B, T + 1, H] (the worker's leaf mode "slice"), a non-leaf and
  non-contiguous view at once, as a trainer slices a causal model's output; backward and
  torch.autograd.grad.

- `frozen-inputs` (probe `frozen`): hidden alone requiring grad (the lm_head frozen: LoRA, adapters),
  then weight and bias alone (the trunk frozen); autograd asks only for those, which is a backward path
  of its own (`ctx.needs_input_grad`): one that dropped 1/T there was accepted in the adversarial round
  of 2026-12-05, since every call had all three requiring grad. Since the twentieth session every proper
  subset is called (`frozen_subsets`: six with a bias, two without), so the weight frozen with the bias
  trainable is met too; since the thirty-sixth session each again with every input an offset, strided view
  (FZV: a frozen trunk's hidden sliced from a model output).
- `grad-accumulation` also has GP (checks/trainer_modes.py, every operation): .grad set before the forward.

Where they apply: members whose spec differentiates `weight` (every grpo-fused-linear member).
What the other issue-31 items already get from the generic probes is in docs/operations.md.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks import patterns
from grpo_conform.checks.buffers import InputSlot
from grpo_conform.checks.conformance import CALL, Call, Probe, WorkloadConformance
from grpo_conform.ops.grpo_logits.declared_cases import record
from grpo_conform.ops.grpo_views import draw_views

ACCUMULATION = "grad-accumulation"
TIED = "tied-weights"
FROZEN = "frozen-inputs"
NON_LEAF = "non-leaf-logits"  # the generic check of inputs handed over as non-leaf tensors
TIED_IDS = 64  # at most this many looked-up ids (counts stay exact in bf16: integers up to 256 are)
TIED_ATTEMPTS = 4  # input sets drawn until one gives a tied row a gradient
TIED_SPREAD = 64.0  # tied rows' reference scales within this factor of the largest one's


def _differentiates_weight(spec: Any) -> str | None:
    """Why a probe of the lm_head weight does not apply (None where it does)."""
    if "weight" not in {g.input for g in spec.gradients}:
        return "no lm_head weight to accumulate into or tie: the spec differentiates no input named 'weight'"
    return None


def odd_sizes(axes: dict[str, int]) -> list[str]:
    """The sizes of a workload that no power-of-two block (2, 4, ..., of rows, of the sequence, of the
    vocabulary, of the hidden size) divides: odd ones. A kernel whose tiles assume a multiple (a
    vocabulary chunk of 4096, 128-row tiles) meets its boundary masks only at such sizes."""
    sizes = {"rows": axes["batch"] * axes["seq"], "seq": axes["seq"], "vocab": axes["vocab"], "hidden": axes["hidden"]}
    return [f"odd {name}" for name, n in sizes.items() if n % 2 == 1]


def _record_blocks(run: WorkloadConformance) -> None:
    """Name the odd sizes this workload's calls exercised (draws["exercised"]["block_boundaries"], the
    coverage line; `verify --require-exercised 'block_boundaries:odd vocab'` can demand one)."""
    for name in odd_sizes(run.rw.axes):
        record(run.draws, "block_boundaries", name)


def _finish(run: WorkloadConformance, label: str, check: str, upstream: float, skipped: dict, how: str,
            adjust=None) -> None:
    """Export the call into O1, then the call's findings (runs, mutation, aliasing, finite) and the
    check against `upstream` times the reference; `adjust` maps the exported gradients to what is judged."""
    exported = run.export(label, run.out1, (check,))
    if exported is None:
        return
    report = exported["report"]
    grads = dict(run.out1.grads) if adjust is None else adjust(dict(run.out1.grads))
    call = Call(label, run.P, upstream, float(run.out1.loss[0]), report.get("loss"), report.get("grads") or {},
                grads, skipped.get(label), exported["kept"])
    run.aliasing(label, report)
    J.finite(run, call)
    J.versus_reference(run, check, call, how)


def accumulation(run: WorkloadConformance) -> None:
    """GA: one forward, backward (c1, retain_graph=True), then a second loss.backward (c2) into the
    same leaves: every .grad already holds c1 times the gradient when the second backward runs, and
    must end at (c1 + c2) times the reference (accumulated, not overwritten)."""
    check = ACCUMULATION
    checks = (check, "no-mutation")
    run.generate(run.P, run.seeds[0] ^ 0xACC)
    c2 = float(f"{run.rng.uniform(0.5, 1.0):.6g}")
    c1 = float(f"{c2 * run.rng.uniform(1.8, 2.4):.6g}")  # see the module docstring: an overwrite is >= 29% off
    run.draws["accumulation_upstream"] = [c1, c2]
    _record_blocks(run)
    label = run._label("GA")
    f = run.forward(label, run.P, checks)
    if f is None:
        return
    first = run.backward([label], [c1], checks, method="backward", retain=True)
    if first is None:
        return
    skipped = run.backward([label], [c2], checks, method="backward")
    if skipped is None:
        return
    run.book.record("runs", label, True, "every call returned")
    run.mutation(label, run.P, {"forward": f["forward"], "backward": run.P.changes()})
    _finish(run, label, check, c1 + c2, {**first, **skipped},
            f"every .grad held {c1:g} x the gradient (a first backward) when loss.backward({c2:g}) ran: "
            f"accumulated {c1 + c2:g} x")


def tie_rows(ids: torch.Tensor, scales: torch.Tensor) -> list[int]:
    """The looked-up rows: completion ids of the batch, in order, as an input embedding reads them, at most
    TIED_IDS lookups, keeping the ids whose weight row's reference scale is at least 1/TIED_SPREAD of the
    largest among them (a row with next to no gradient would force a tie term too small to show
    elsewhere: peaked rows put p ~ e^-20 on most of the vocabulary). [] when no row has a gradient."""
    flat = [int(i) for i in ids.reshape(-1).tolist()]
    top = max((float(scales[i]) for i in flat), default=0.0)
    if top <= 0.0:
        return []
    return [i for i in flat if float(scales[i]) >= top / TIED_SPREAD][:TIED_IDS]


def tie_scale(scales: torch.Tensor, counts: torch.Tensor, allowed: torch.Tensor | None = None) -> float:
    """The term s of the tie over rows with `counts` lookups (`tie_plan` without the choice of rows)."""
    return tie_plan(scales, counts, allowed)[0]


def tie_plan(scales: torch.Tensor, counts: torch.Tensor,
             allowed: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
    """(s, the rows kept). With each row's allowance `a` (`allowed`): a row of count c, scale m can take
    a power of two s with s c >= 4 a (a lost term fails by 4 allowances, however loose the row's
    tolerance) and (m + s c) 2^-8 <= a / 2 (the bf16 rounding of the sum autograd makes stays under
    half an allowance). s is the power of two that the most rows admit (then the largest); only those
    rows are tied. One s for every row failed on some draws (gallery fused-grad-assigned, CI 2026-12-03:
    the loosest row forced s too large for the tightest one, and the fallback's s hid inside every row's
    tolerance). Where no row admits one, or without allowances: every row, s the largest power of two at
    most min over rows of m / (4 c) (the module docstring); 0.0 when no tied row has a reference scale."""
    used = counts > 0
    if allowed is not None:
        c, a = counts.to(torch.float64), allowed.to(torch.float64)
        m = scales.to(torch.float64)
        ok = used & (a > 0)
        low = torch.where(ok, 4.0 * a / c.clamp(min=1), math.inf)
        high = torch.where(ok, (128.0 * a - m) / c.clamp(min=1), -math.inf)
        best = (0, 0.0)
        for e in sorted({math.ceil(math.log2(float(v))) for v in low[ok & (high >= low)].tolist()}):
            s = 2.0 ** e
            n = int(((low <= s) & (s <= high)).sum())
            if n >= best[0]:
                best = (n, s)
        if best[0] > 0:
            s = best[1]
            return s, (low <= s) & (s <= high)
    return _scale_rule(scales, counts, used), used


def _scale_rule(scales: torch.Tensor, counts: torch.Tensor, used: torch.Tensor) -> float:
    ratio = scales[used].to(torch.float64) / (4.0 * counts[used].to(torch.float64))
    ratio = ratio[ratio > 0]
    if ratio.numel() == 0:
        return 0.0
    return 2.0 ** math.floor(math.log2(float(ratio.min())))


def tied(run: WorkloadConformance) -> None:
    """TW: the weight also used as the input embedding of the completion ids (tied embeddings):
    loss + s * embedding(ids, weight).sum() backpropagated; weight.grad minus s at each looked-up
    row (per lookup) must match the reference."""
    check = TIED
    checks = (check, "no-mutation")
    for attempt in range(TIED_ATTEMPTS):  # an input set whose weight gradient is 0 (every sequence clipped) shows nothing
        run.generate(run.P, run.seeds[1 % len(run.seeds)] ^ (0x71ED + attempt))
        x = run.P.pristine
        vocab = x["weight"].shape[0]
        scales = torch.zeros(vocab, dtype=torch.float64)
        allowed = torch.zeros(vocab, dtype=torch.float64)
        model = run.op.error_model(run.spec, x, run.model.params, run.grad_dtype)
        for chunk in run.op.reference_gradients(run.spec, x, run.model.params)["weight"]:
            scales[chunk.start : chunk.stop] = chunk.scale.to("cpu", torch.float64)
            if model is not None:
                allowed[chunk.start : chunk.stop] = model.allowance("weight", chunk.start, chunk.stop,
                                                                    chunk.scale).to("cpu", torch.float64)
        rows = tie_rows(x["completion_ids"].cpu(), scales)
        counts = torch.bincount(torch.tensor(rows, dtype=torch.long), minlength=vocab)
        s, kept = tie_plan(scales, counts, allowed if model is not None else None) if rows else (0.0, None)
        if s > 0.0:
            rows = [i for i in rows if bool(kept[i])]
            counts = torch.where(kept, counts, 0)
            break
    else:
        run.book.skip(check, f"no completion id's weight row had a reference gradient in {TIED_ATTEMPTS} input sets "
                             "(every sequence clipped?): a lost contribution would not show")
        return
    _record_blocks(run)
    run.draws["tied_weights"] = {"ids": len(rows), "distinct": int((counts > 0).sum()), "scale": s}
    label = run._label("TW")
    f = run.forward(label, run.P, checks, tie={"input": "weight", "rows": rows, "scale": s})
    if f is None:
        return
    skipped = run.backward([label], [1.0], checks, method="backward")
    if skipped is None:
        return
    run.book.record("runs", label, True, "every call returned")
    run.mutation(label, run.P, {"forward": f["forward"], "backward": run.P.changes()})
    tie_grad = (s * counts.to(torch.float64))[:, None]

    def untie(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        w = grads["weight"]
        grads["weight"] = w.to(torch.float64) - tie_grad.to(w.device)  # exact: float64 holds both
        return grads

    _finish(run, label, check, 1.0, skipped,
            f"weight also the input embedding of {len(rows)} completion ids ({int((counts > 0).sum())} rows), "
            f"term {s:g} x sum of the lookups; judged after subtracting its gradient", adjust=untie)


def model_slice(run: WorkloadConformance) -> None:
    """NS: hidden handed over as `out[:, :-1]` of a leaf `out` [B, T + 1, H] (a causal model's last hidden
    states with the last position dropped: a non-leaf, non-contiguous view), through backward and
    torch.autograd.grad; the gradient read from `out` without its last position must match the reference."""
    run.generate(run.Q, run.seeds[0] ^ 0x5_11CE)
    for method in ("backward", "autograd.grad"):
        patterns.exercised(run, "model-output-slice")
        n = run.call("N-slice", run.Q, run.out2, (NON_LEAF, "finite", "no-mutation", "no-aliasing"),
                     leaf="slice", method=method)
        if n is not None:
            J.finite(run, n)
            J.versus_reference(run, NON_LEAF, n, f"hidden as out[:, :-1] of a leaf out [B, T + 1, H], {method}")


def frozen(run: WorkloadConformance) -> None:
    """FZ: only some differentiable inputs require grad, as a trainer freezes them: the lm_head frozen (LoRA,
    adapters: hidden alone), the trunk frozen (a probe or a new head: weight and bias alone), and every
    other proper subset (`frozen_subsets`). Autograd then
    asks the implementation for those only (`ctx.needs_input_grad`), a backward path of its own; each
    gradient returned must match the reference at an upstream scalar drawn in [0.5, 2]."""
    names = [g.input for g in run.spec.gradients]
    run.generate(run.Q, run.seeds[0] ^ 0xF205E)
    for subset in frozen_subsets(names):
        c = float(f"{run.rng.uniform(0.5, 2.0):.6g}")
        patterns.exercised(run, "frozen-" + "-".join(n for n in names if n not in subset))
        call = run.call("FZ-" + "+".join(subset), run.Q, run.out2, (FROZEN, "finite", "no-mutation", "no-aliasing"),
                        upstream=c, only=subset)
        if call is not None:
            J.finite(run, call)
            J.versus_reference(run, FROZEN, call, f"only {', '.join(subset)} requiring grad "
                                                  f"({', '.join(n for n in names if n not in subset)} frozen)")
    _frozen_views(run, names)


def _frozen_views(run: WorkloadConformance, names: list[str]) -> None:
    """FZV: every subset again with every input an offset, strided view of a larger buffer (the layouts probe's
    set V): a frozen trunk's hidden is `out[:, P-1:-1]` of a model output, and a backward path taken only with
    some inputs frozen (the weight-only one) read hidden as contiguous rows while FZ's set was contiguous and
    the layouts probe's inputs all required grad (gallery fused-frozen-trunk-strided-hidden, thirty-sixth session).
    A hostile kernel cannot tell these calls from a trainer's: a frozen model output sliced is what one hands over;
    one right only on strided frozen inputs fails the contiguous FZ calls above."""
    if "V" not in run.extra_slots:
        run.V = InputSlot.create_views(run.session, "V", run.rw.shapes, run.dtypes, run.rng)
        run.extra_slots.append("V")
    # its rows audible but the edge rows, their kinds the layouts call's next turn (grpo_views)
    run.draws["frozen_views_rows"] = draw_views(run, run.V, run.seeds[0] ^ 0xF205F, turn=1)
    for subset in frozen_subsets(names):
        c = float(f"{run.rng.uniform(0.5, 2.0):.6g}")
        patterns.exercised(run, "frozen-strided-views")
        call = run.call("FZV-" + "+".join(subset), run.V, run.out2,
                        (FROZEN, "finite", "no-mutation", "no-aliasing"), upstream=c, only=subset)
        if call is not None:
            J.finite(run, call)
            J.versus_reference(run, FROZEN, call, f"only {', '.join(subset)} requiring grad, every input an offset, "
                                                  "strided view: " + ", ".join(
                                                      f"{k} stride {v['stride']}" for k, v in run.V.layout.items()))
    run.release("V")  # no later probe reads V


def frozen_subsets(names: list[str]) -> list[tuple[str, ...]]:
    """Every proper, non-empty subset of the differentiable inputs, in the spec's order, larger subsets
    last: (hidden), (weight) for a member without bias; with a bias also (bias) and the three pairs, so a
    backward path that only one pattern of frozen inputs takes (the weight frozen, the bias not) is
    called. Until the twentieth session: hidden alone and the rest together, two of the six."""
    return [tuple(c) for k in range(1, len(names)) for c in itertools.combinations(names, k)]


def _frozen_applies(spec: Any) -> str | None:
    names = {g.input for g in spec.gradients}
    if _differentiates_weight(spec) is not None:
        return _differentiates_weight(spec)
    if "hidden" not in names:
        return "hidden is not differentiated: nothing to freeze beside it"
    return None


def _has_sequence_input(spec: Any) -> str | None:
    """Why the model-output slice does not apply (None where a differentiable input has a sequence axis)."""
    if any(len(spec.input(g.input).shape) >= 3 for g in spec.gradients):
        return _differentiates_weight(spec)
    return "no differentiable input of three or more dimensions to slice from a longer model output"


FUSED_PROBES = (
    # no check of its own: prefilled-grad (checks/trainer_modes.py, every operation) stands for grad-accumulation
    Probe("accumulation", accumulation.__doc__, accumulation, CALL + (ACCUMULATION, "finite"), (),
          _differentiates_weight),
    Probe("tied", tied.__doc__, tied, CALL + (TIED, "finite"), (TIED,), _differentiates_weight),
    # Feeds the generic non-leaf check (no check of its own: the view and affine calls already stand for it).
    Probe("model-slice", model_slice.__doc__, model_slice, CALL + (NON_LEAF, "finite"), (), _has_sequence_input),
    Probe("frozen", frozen.__doc__, frozen, CALL + (FROZEN, "finite"), (FROZEN,), _frozen_applies),
)
