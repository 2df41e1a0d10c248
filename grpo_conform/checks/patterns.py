"""Call patterns beyond one forward and one backward: several graphs alive at once, inputs as
views of larger buffers, forward-only calls. Each is judged against the reference."""

from __future__ import annotations

import math

from grpo_conform.checks import judging as J
from grpo_conform.checks.buffers import InputSlot
from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.compare import compare_loss, json_float


def _finish(run: WorkloadConformance, label: str, slot: InputSlot, c: float, skipped: dict[str, str],
            check: str, how: str) -> None:
    exported = run.export(label, run.out1, (check,))
    if exported is None:
        return
    report = exported["report"]
    call = Call(label, slot, c, float(run.out1.loss[0]), report.get("loss"), report.get("grad"), run.out1.grad,
                skipped.get(label), exported["kept"])
    run.aliasing(label, report)
    J.finite(run, call)
    J.versus_reference(run, check, call, how)


def interleaved(run: WorkloadConformance, c: float) -> None:
    """Two forwards, then backward of their weighted sum; two forwards, then backwards in the
    opposite order. Each gradient must match the reference of its own inputs."""
    check = "interleaved-graphs"
    checks = (check, "no-mutation")
    seeds = (run.seeds[0] ^ 0x0F0F0F0F, run.seeds[1 % len(run.seeds)] ^ 0x70707070)
    for round_, order in (("sum", None), ("reversed", (1, 0))):
        run.generate(run.P, seeds[0] ^ len(round_))
        run.generate(run.Q, seeds[1] ^ len(round_))
        slots = (run.P, run.Q)
        labels = [run._label(f"X-{round_}-{name}") for name in ("P", "Q")]
        fwd = []
        for label, slot in zip(labels, slots):
            f = run.forward(label, slot, checks)
            if f is None:
                return
            fwd.append(f)
        ups = [c, 1.0] if round_ == "sum" else [1.0, c]
        if order is None:
            skipped = run.backward(labels, ups, checks)
            if skipped is None:
                return
        else:
            skipped = {}
            for k in order:
                part = run.backward([labels[k]], [ups[k]], checks)
                if part is None:
                    return
                skipped.update(part)
        for label, slot, f, u in zip(labels, slots, fwd, ups):
            run.book.record("runs", label, True, "every call returned")
            run.mutation(label, slot, {"forward": f["forward"], "backward": slot.changes()})
            how = ("two graphs, backward of c1*L1 + L2" if order is None else
                   "two graphs, backward of the second first")
            _finish(run, label, slot, u, skipped, check, how)
    run.draws["interleaved_upstream"] = c


def layouts(run: WorkloadConformance) -> None:
    """Every input as an offset, strided view of a larger shared buffer (last dimension
    contiguous): what slices like input_ids[:, P:] and padded vocabularies give a kernel."""
    check = "input-layouts"
    # A spec without a `layouts` declaration (the frozen seed file) asks for views of every
    # input, as a torch function's contract does; one may declare contiguous-only inputs.
    declared = dict(getattr(run.spec, "layouts", None) or {})
    if declared and not any(k != "contiguous" for kinds in declared.values() for k in kinds):
        run.book.not_applicable(check, "the spec declares contiguous inputs only")
        return
    if "V" not in run.extra_slots:
        run.V = InputSlot.create_views(run.session, "V", run.rw.shapes, run.dtypes, run.rng)
        run.extra_slots.append("V")
    run.generate(run.V, run.seeds[0] ^ 0x7A7A7A7A)
    run.draws["layouts"] = run.V.layout
    call = run.call("L", run.V, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
    if call is not None:
        J.finite(run, call)
        J.versus_reference(run, check, call, "offset, strided views: " + ", ".join(
            f"{k} stride {v['stride']} offset {v['storage_offset']}" for k, v in run.V.layout.items()))


def forward_only(run: WorkloadConformance) -> None:
    """A call under torch.no_grad: the loss must match the reference."""
    check = "forward-only"
    run.generate(run.P, run.seeds[0] ^ 0x0BAD5EED)
    label = run._label("O")
    f = run.forward(label, run.P, (check, "no-mutation"), grad=False)
    if f is None:
        return
    exported = run.export(label, run.out1, (check,), keep=False)
    if exported is None:
        return
    run.mutation(label, run.P, {"forward": f["forward"]})
    desc = exported["report"].get("loss")
    actual = float(run.out1.loss[0])
    expected = run.model.loss(run.P.pristine)
    cmp = compare_loss(actual, expected, run.tol.loss, run.loss_floor(run.P.pristine))  # as judge's loss allowance
    ok = cmp.passed and desc is not None and "dtype" in desc
    msg = (f"under torch.no_grad the loss {actual:.9g} matches {expected:.9g}" if ok else
           f"under torch.no_grad: the loss is not a tensor ({desc})" if not (desc and "dtype" in desc) else
           f"under torch.no_grad: |{actual:.9g} - {expected:.9g}| > {cmp.allowed:.3g}")
    run.book.record(check, label, ok, msg, {"loss": cmp.to_json(), "loss_description": desc,
                                            "finite": math.isfinite(actual), "value": json_float(actual)})
