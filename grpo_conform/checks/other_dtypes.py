"""The `other-dtypes` probe: the value probes again in each dtype the member declares that no default
workload uses.

A member's default workloads may all share one dtype while its spec declares others for the differentiable
input; before this probe the only calls in those were reach's, with ordinary values. A kernel with a float16
path of its own (an exact tie handed to the clipped branch, a log-sum-exp without the row max, a gradient
rounded to float16 before a loss-scaling upstream multiplies it) passed every check (the twenty-eighth
session's adversarial round: docs/checks.md). Which probes test values is data: the registry builds this probe
from them (`probes.OTHER_DTYPES`), and it repeats those of them the run's selection kept.

For each such dtype, once per worker process and member (what it looks for is a property of the code): the
member's smallest default workload on the device, its axes drawn up to 1.5x, in that dtype (the inputs that declare the same dtypes
follow it), in fresh input and output slots; the named probes run there as they run in a workload, their
findings under their own checks, every call label starting with the dtype ("float16:T#41"). Nothing of
the pass is kept for the end re-read (its slots have other shapes and dtypes), and its draws are kept
apart (`draws["other_dtypes"][dtype]`).
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.buffers import InputSlot, OutputSlot, input_dtypes
from grpo_conform.checks.calls import PLAIN
from grpo_conform.checks.conformance import Probe, WorkloadConformance
from grpo_conform.checks import member_calls
from grpo_conform.checks.shaped import at_shape
from grpo_conform.dtypes import torch_dtype
from grpo_conform.ops.grpo_logits.generators.masks import EDGES
from grpo_conform.phases import PHASES

NAME = "other-dtypes"
#: rows of the pass's multi-row calls: a set holds every edge row (masks.EDGES: 0, 1 and all positions kept) and an
#: ordinary one from here on
ROWS = len(EDGES) + 1
#: the run's state a pass replaces and gives back (the lazily made Q, K and O2 and the row judge are dropped)
_SWAPPED = ("rw", "dtypes", "P", "out1", "grad_dtype", "tol", "subnormal", "seq_next", "width", "state", "draws",
            "keep_budget", "slot_tag")
_LAZY = ("Q", "K", "out2", "rows")


def smallest_workload(run: WorkloadConformance) -> Any:
    """The member's default workload on this device with the fewest elements (fixed axes only)."""
    return member_calls.smallest_workload(run.spec, run.device.type) or run.rw.workload


def drawn_axes(run: WorkloadConformance, w: Any, dtype: str, announced: bool = True) -> dict[str, int]:
    """`w`'s free axes, each drawn in [v, 3v/2] (member_calls.drawn_axes): per member from a secret of the process,
    so the slot's compile-ahead worker compiles this shape first; or, for the pass it is never shown
    (`announced` false), from the workload's seeds. Never from `run.rng`, so no later draw moves."""
    if announced:
        return member_calls.drawn_axes(run.spec, w, dtype)
    return member_calls.drawn_axes(run.spec, w, dtype, random.Random(f"{run.seeds[-1]}:{NAME}:{dtype}"))


@contextmanager
def in_dtype(run: WorkloadConformance, dtype: str, announced: bool = True) -> Iterator[None]:
    """The run's slots, workload and tolerances switched to the smallest default workload in `dtype`, its axes
    drawn (`drawn_axes`)."""
    saved = {k: run.__dict__[k] for k in _SWAPPED}
    lazy = {k: run.__dict__.pop(k) for k in _LAZY if k in run.__dict__}
    w = smallest_workload(run)
    wanted = member_calls.with_dtype(run.spec, w, dtype)
    rw = run.spec.resolve(w.model_copy(update={"dtypes": wanted, "axes": drawn_axes(run, w, dtype, announced)}))
    tag = dtype
    try:
        run.slot_tag, run.rw, run.seq_next = tag, rw, rw.axes.get("seq_next")
        run.dtypes = input_dtypes(run.spec, rw)
        run.P = InputSlot.create(run.session, "P" + tag, rw.shapes, run.dtypes)
        run.extra_slots.append(run.P.name)  # each named as soon as it exists: the run unbinds them at its end
        run.out1 = OutputSlot.for_spec(run.session, "O1" + tag, run.spec, rw.shapes, run.dtypes)
        run.extra_slots.append(run.out1.name)
        run.width = run.groupings[run.spec.differentiable_input.name].width(rw)
        run.grad_dtype, run.tol = dtype, run.spec.tolerance(dtype)
        info = torch.finfo(torch_dtype(dtype))
        run.subnormal = 2.0 * info.tiny * info.eps
        run.state, run.draws, run.keep_budget = {}, {"workload": w.name, "axes": dict(rw.axes), "announced": announced}, 0
        yield
    finally:
        passed = run.draws
        for k in _LAZY:
            run.__dict__.pop(k, None)
        run.__dict__.update(saved)
        run.__dict__.update(lazy)
        run.draws.setdefault("other_dtypes", {})[dtype] = passed


def multi_row_axes(run: WorkloadConformance) -> dict[str, int] | None:
    """The axes of the pass's multi-row calls (ROWS sequences, a quarter of the pass's positions each, at least
    4), or None where the pass's own sets hold ROWS rows already. The pass runs at the smallest default workload,
    one sequence where that is mask-b1-long: no set of it can hold an empty row beside a kept one, and a kernel
    path of the dtype's own that divided by zero kept tokens, or left such rows out of the batch mean, passed."""
    if run.rw.axes.get("batch", ROWS) >= ROWS:
        return None
    axes = {a.name: run.rw.axes[a.name] for a in run.spec.axes if a.derivation() is None}
    return {**axes, "batch": ROWS, "seq": max(4, -(-axes["seq"] // ROWS))}


def rows_in_dtype(run: WorkloadConformance) -> None:
    """B4 (the other-dtypes pass's baseline): one plain call in the pass's dtype at `multi_row_axes`, contiguous,
    its mask holding an empty row, a single kept token and a full row beside an ordinary one (masks.row_layouts),
    judged as the baseline is (loss, gradient, row sums, last row)."""
    axes = multi_row_axes(run)
    if axes is None:
        return
    with at_shape(run, "RB", "RBO", axes) as (inp, out):
        run.generate(inp, run.seeds[0] ^ 0x4B0E5)
        run.draws["multi_row_axes"] = dict(axes)
        call = run.call("B4", inp, out, PLAIN, keep=False)
        if call is not None:
            J.plain(run, call)


def other_dtypes(run: WorkloadConformance, repeated: tuple[Probe, ...] = ()) -> None:
    """The value probes (`repeated`, those of them whose names this run selected) again in each declared dtype
    of the differentiable input no default workload uses, at the smallest default workload's shape, drawn up to
    1.5x. A repeated probe may be a lighter variant of the registry's of the same name (declared-cases: the
    defaults and equalities only)."""
    selected = {p.name for p in run.probes}
    probes = [p for p in repeated if p.name in selected and not p.applies(run.spec)]
    dtypes = member_calls.unused_dtypes(run.spec, run.device.type)
    if not probes or not dtypes:
        run.draws[NAME] = "every declared dtype has a default workload" if not dtypes else "no value probe selected"
        return
    made_in = run.made_in(NAME)
    if made_in is not None:
        run.draws[NAME] = f"made once per worker process: its calls ran in workload {made_in}"
        return
    unshown = run.rng.choice(dtypes)  # the pass compile-ahead is never shown (member_calls.py says why)
    for dtype in dtypes:
        with in_dtype(run, dtype, announced=dtype != unshown):
            for probe in probes:
                with PHASES.inclusive("probes", f"{probe.name}@{dtype}"):
                    probe.run(run)


def make_probe(repeated: tuple[Probe, ...]) -> Probe:
    """The probe as the registry lists it: it feeds every check of the probes it repeats (so `-k exact-ties`
    keeps it, and it repeats only what the selection kept)."""
    names = tuple(p.name for p in repeated)
    feeds = tuple(dict.fromkeys(c for p in repeated for c in p.feeds))

    def run(r: WorkloadConformance) -> None:
        other_dtypes(r, repeated)
    return Probe(NAME, "the value probes again in each dtype the differentiable input declares that no default "
                       f"workload uses, at the smallest default workload's shape drawn up to 1.5x: {', '.join(names)}", run, feeds)
