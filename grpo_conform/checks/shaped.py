"""Calls at a shape other than the workload's: input and output slots of their own, and the run's per-shape
state (the resolved workload, the gradient's row width, its dtype's tolerance) set to that shape while they
run. The reach probe's calls (checks/reach.py) and the trainer-shaped probe's padded batch
(ops/grpo_padded.py) are made this way; every other call runs at the workload's shape."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from grpo_conform.checks.buffers import InputSlot, OutputSlot, input_dtypes
from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.dtypes import torch_dtype


@contextmanager
def at_shape(run: WorkloadConformance, inputs: str, outputs: str, axes: dict[str, int],
             dtypes: dict[str, str] | None = None, grad_dtype: str | None = None, views: bool = False
             ) -> Iterator[tuple[InputSlot, OutputSlot]]:
    """(input slot `inputs`, output slot `outputs`) at the workload's `axes` (every free axis; `dtypes`: the
    workload's dtypes where not given), the run set to that shape inside and back to its own after. The slots
    are released with the workload's (`extra_slots`). Their calls keep nothing (keep=False): the kept outputs
    are re-read into the workload's own slots at its end. `views`: the inputs offset, strided views of padded
    buffers (`InputSlot.create_views`, the layouts probe's)."""
    saved = (run.rw, run.seq_next, run.width, run.grad_dtype, run.tol, run.subnormal)
    update = {"axes": axes, **({"dtypes": dtypes} if dtypes is not None else {})}
    rw = run.spec.resolve(run.rw.workload.model_copy(update=update))
    types = input_dtypes(run.spec, rw)
    inp = InputSlot.create_views(run.session, inputs, rw.shapes, types, run.rng) if views else \
        InputSlot.create(run.session, inputs, rw.shapes, types)
    out = OutputSlot.for_spec(run.session, outputs, run.spec, rw.shapes, types)
    run.extra_slots += [inp.name, out.name]
    # known to the engine's caches while in use: its float64 log-probs, reference loss and row floors computed once
    # per content, as a workload slot's (each reach call computed its log-probs three times: ~0.1 s a call on the CPU)
    run.shaped.append(inp)
    dtype = grad_dtype or run.grad_dtype
    try:
        run.rw, run.seq_next = rw, rw.axes.get("seq_next")
        run.width = run.groupings[run.spec.differentiable_input.name].width(rw)
        run.grad_dtype, run.tol = dtype, run.spec.tolerance(dtype)
        info = torch.finfo(torch_dtype(dtype))
        run.subnormal = 2.0 * info.tiny * info.eps
        yield inp, out
    finally:
        run.shaped.remove(inp)
        run.rw, run.seq_next, run.width, run.grad_dtype, run.tol, run.subnormal = saved
