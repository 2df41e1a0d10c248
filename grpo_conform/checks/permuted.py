"""The permuted probe (PM): D's inputs with their sequences rotated in place, every input at its own address.

Freshness rewrote values (C: one input negated in place; D: new buffers, new values), so every sum of an input
changed with them. A kernel caching a result from its previous call keyed on the inputs' addresses, shapes and sums
(reference log-probs of a reference head, a normaliser) is blind to values moved inside a tensor, and passed every
default run (forty-second session's red team: a cache of the reference log-probs, right whenever the values or
their sums changed). Here every input with a leading batch axis has its sequences rotated by one (no sequence stays
where it was; each sum, and each input's multiset of values, is unchanged), written into the same buffers. Judged
under `freshness` as C and D are: the results must follow the inputs.

How a hostile kernel could still pass: a cache keyed on a hash of every element, which is a hash of the values,
so it is right; or one that keeps the last call's per-sequence results and looks them up by a sequence's own
contents, which is right too. A batch of one has nothing to rotate, so the probe skips it.
"""

from __future__ import annotations

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, Probe, WorkloadConformance


def permuted(run: WorkloadConformance) -> None:
    """PM: D's inputs (Q) with the sequences of every batch-leading input rotated by one, in place."""
    Q = run.Q
    batch = run.rw.axes.get("batch", 1)
    if batch < 2 or not Q.drawn:  # freshness keeps its other calls (C, D)
        return
    rotated = [n for n in Q.tensors if run.spec.has_input(n) and tuple(run.spec.input(n).shape)[:1] == ("batch",)]
    kept = {n: Q.tensors[n].clone() for n in rotated}  # Q as D left it (buffers and pristine copies agree there)
    temperature = run.model.temperature
    try:
        before = run.slot_key(Q)
        for n in rotated:
            t = Q.tensors[n]
            t.copy_(torch.roll(t, shifts=1, dims=0))
        Q.commit()
        # the log-probs rotate with the sequences: no second float64 pass (nor a third after the restore below)
        run.refs.carry_logp(before, run.slot_key(Q), temperature, lambda v: torch.roll(v, shifts=1, dims=0))
        run.draws["permuted"] = {"rotated": rotated, "shift": 1}
        call = run.call("PM", Q, run.out1, ("freshness", "finite", "no-mutation", "no-aliasing"))
        if call is not None:
            J.finite(run, call)
            J.fresh(run, call, "sequences rotated in place: every sum kept")
    finally:
        during = run.slot_key(Q)
        for n, t in kept.items():
            Q.tensors[n].copy_(t)
        Q.commit()  # a new version: the reference cache keys on it, and held the rotated set's log-probs
        run.refs.carry_logp(during, run.slot_key(Q), temperature, lambda v: torch.roll(v, shifts=-1, dims=0))


PERMUTED = Probe("permuted", permuted.__doc__, permuted, CALL + ("freshness", "finite"), needs=("new-buffers",))
