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
  embedding's accumulation first). s is the largest power of two at most 1/4 of the smallest
  reference scale of a tied row divided by its count: the bf16 rounding of the sum stays within the
  unit's tolerance, a lost contribution is at least 1/8 of a tied row's scale. Where the rows' allowances
  are known (the operation's error model) s is raised to at least 4 allowances per tied row when its
  rounding stays under half an allowance: at 1/8 of the scale a lost term passed once in a CI run
  (gallery fused-grad-assigned, 2026-12-03), inside a loose row tolerance.

Both also name the workload's odd sizes (rows, seq, vocab, hidden: `odd_sizes`) in the coverage's
`block_boundaries` category: the tiles' boundary masks of a blocked kernel are met only there (the CPU
tier's odd-bf16 has 21 rows, seq 7, vocab 1003; tests/test_fused_probes.py keeps it so).

- `model-slice` (probe NS, no check of its own: it feeds `non-leaf-logits`): hidden handed over as
  `out[:, :-1]` of a leaf `out` [B, T + 1, H] (the worker's leaf mode "slice"), a non-leaf and
  non-contiguous view at once, as a trainer slices a causal model's output; backward and
  torch.autograd.grad.

Where they apply: members whose spec differentiates `weight` (every grpo-fused-linear member).
What the other issue-31 items already get from the generic probes is in docs/operations.md.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks import patterns
from grpo_conform.checks.conformance import CALL, Call, Probe, WorkloadConformance
from grpo_conform.ops.grpo_logits.declared_cases import record

ACCUMULATION = "grad-accumulation"
TIED = "tied-weights"
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
    """With each row's allowance (`allowed`): the smallest power of two whose term, s x count, is at
    least 4 allowances on every tied row, if its rounding there stays under half an allowance (2^-8 of
    the row's magnitude: a bf16 half-ulp, doubled); a lost term then fails however loose the row's
    tolerance is (a term fixed at 1/8 of the scale hid inside it on some draws). Otherwise, as before:
    the largest power of two at most min over tied rows of scale / (4 count) (see the module docstring);
    0.0 when every tied row has a zero reference scale (nothing can be told apart there)."""
    used = counts > 0
    base = _scale_rule(scales, counts, used)
    if allowed is not None and base > 0.0:
        c, a, sc = counts[used].to(torch.float64), allowed[used].to(torch.float64), scales[used].to(torch.float64)
        s = max(base, 2.0 ** math.ceil(math.log2(max(float((4.0 * a / c).max()), 1e-300))))
        if bool((((sc + s * c) * 2.0**-8) <= a / 2).all()):
            return s
    return base


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
        s = tie_scale(scales, counts, allowed if model is not None else None) if rows else 0.0
        if s > 0.0:
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


def _has_sequence_input(spec: Any) -> str | None:
    """Why the model-output slice does not apply (None where a differentiable input has a sequence axis)."""
    if any(len(spec.input(g.input).shape) >= 3 for g in spec.gradients):
        return _differentiates_weight(spec)
    return "no differentiable input of three or more dimensions to slice from a longer model output"


FUSED_PROBES = (
    Probe("accumulation", accumulation.__doc__, accumulation, CALL + (ACCUMULATION, "finite"), (ACCUMULATION,),
          _differentiates_weight),
    Probe("tied", tied.__doc__, tied, CALL + (TIED, "finite"), (TIED,), _differentiates_weight),
    # Feeds the generic non-leaf check (no check of its own: the view and affine calls already stand for it).
    Probe("model-slice", model_slice.__doc__, model_slice, CALL + (NON_LEAF, "finite"), (), _has_sequence_input),
)
