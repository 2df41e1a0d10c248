"""Call patterns beyond one forward and one backward: inputs as views of larger buffers, forward-only
calls, retained graphs, repeated calls (several graphs alive at once: checks/graphs.py). Each is judged
against the reference."""

from __future__ import annotations

import math

from grpo_conform.checks import judging as J
from grpo_conform.checks.buffers import InputSlot, OutputSlot
from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.compare import bitwise_equal, compare_loss, describe_outputs, json_float
from grpo_conform.dtypes import torch_dtype
from grpo_conform.ops.grpo_probes import mask_input, small_axes
from grpo_conform.checks import member_calls
from grpo_conform.checks.shaped import at_shape
from grpo_conform.ops.grpo_views import audible_scalars, draw_views
from grpo_conform.checks.other_dtypes import multi_row_axes


def layouts(run: WorkloadConformance) -> None:
    """Every input as an offset, strided view of a larger shared buffer (last dimension
    contiguous): what slices like input_ids[:, P:] and padded vocabularies give a kernel."""
    check = "input-layouts"  # where it applies: probes._contiguous_only
    if "V" not in run.extra_slots:
        run.V = InputSlot.create_views(run.session, "V", run.rw.shapes, run.dtypes, run.rng)
        run.extra_slots.append("V")
    # every row audible (mask, per-sequence scalars, live sequence ratios): a wrong pitch misreads every row but the first
    run.draws["layouts_rows"] = draw_views(run, run.V, run.seeds[0] ^ 0x7A7A7A7A)
    run.draws["layouts"] = run.V.layout
    exercised(run, "strided-views")
    call = run.call("L", run.V, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
    if call is not None:
        J.finite(run, call)
        J.versus_reference(run, check, call, "offset, strided views: " + ", ".join(
            f"{k} stride {v['stride']} offset {v['storage_offset']}" for k, v in run.V.layout.items()))
    del call
    run.release("V")  # no later probe reads V
    _layouts_mask_dtypes(run, check)
    axes = multi_row_axes(run)
    unused = member_calls.unused_dtypes(run.spec, run.device.type)
    if axes is not None and run.grad_dtype in unused:
        _layouts_batch_pitch(run, check, axes, 1 + unused.index(run.grad_dtype))


def _layouts_mask_dtypes(run: WorkloadConformance, check: str) -> None:
    """L-<dtype>: the views again with the mask input in each other dtype it declares (once per worker process and
    member: a property of the code). The strided set took the workload's own mask dtype and the other dtypes came
    only in contiguous sets (Q, K), so an int32 mask passed zero-copy and read with a contiguous row pitch passed
    every default run (forty-second session's red team, gallery `int32-mask-strided-read-contiguous`)."""
    mask = mask_input(run)
    if mask is None or run.made_in("layouts_mask_dtypes") is not None:
        return
    own = run.dtypes[mask]
    for d in run.spec.input(mask).dtypes:
        if torch_dtype(d) == own:
            continue
        run.VM = InputSlot.create_views(run.session, "VM", run.rw.shapes, {**run.dtypes, mask: torch_dtype(d)},
                                        run.rng)
        run.extra_slots.append("VM")
        draw_views(run, run.VM, run.seeds[0] ^ 0x7A7A7A7B)
        call = run.call(f"L-{d}", run.VM, run.out1, (check, "finite", "no-mutation", "no-aliasing"))
        if call is not None:
            J.finite(run, call)
            J.versus_reference(run, check, call, f"offset, strided views, the mask in {d}")
        del call
        run.release("VM")


def _layouts_batch_pitch(run: WorkloadConformance, check: str, axes: dict[str, int], turn: int) -> None:
    """The other-dtypes pass runs at the smallest workload, one sequence, and no other workload uses its dtype: a
    float16 path that walks sequences at a contiguous tensor's batch pitch ((seq + 1) * row pitch) read right in
    every strided call there (gallery fp16-batch-at-contiguous-pitch). So one more strided call, at the pass's
    multi-row axes (other_dtypes.multi_row_axes: four sequences, so V's edge rows come too)."""
    with at_shape(run, "VB", "VBO", axes, views=True) as (inp, out):
        run.draws["layouts_batch_rows"] = draw_views(run, inp, run.seeds[0] ^ 0x7A7A7A7B, turn)
        run.draws["layouts_batch"] = inp.layout
        call = run.call("L2", inp, out, (check, "finite", "no-mutation", "no-aliasing"), keep=False)
        if call is not None:
            J.finite(run, call)
            J.versus_reference(run, check, call, f"{axes['batch']} sequences, offset, strided views: " + ", ".join(
                f"{k} stride {v['stride']} offset {v['storage_offset']}" for k, v in inp.layout.items()))


def exercised(run: WorkloadConformance, pattern: str) -> None:
    """Name a call pattern this workload made (draws["call_patterns"], for the coverage list)."""
    made = run.draws.setdefault("call_patterns", [])
    if pattern not in made:
        made.append(pattern)


def forward_only(run: WorkloadConformance) -> None:
    """A call under torch.no_grad, and one with grad enabled and no input requiring grad (an evaluation step
    outside no_grad, a frozen model: `ctx.needs_input_grad` all False, the forward-only path a kernel may pick
    from it rather than from the grad mode): the loss must match the reference."""
    _forward_only(run, "forward-only", "O", run.seeds[0] ^ 0x0BAD5EED, inference=False)
    _forward_only(run, "forward-only", "OF", run.seeds[-1] ^ 0x0F205E, inference=False, frozen=True)


def inference_mode(run: WorkloadConformance) -> None:
    """A call under torch.inference_mode: the loss must match the reference and every input must be
    bitwise unchanged after it (a kernel that works in place "because nothing needs the inputs"
    when no graph can be built shows here, and is judged here rather than under no-mutation)."""
    _forward_only(run, "inference-mode", "IM", run.seeds[0] ^ 0x1F3E7E, inference=True)


def _forward_only(run: WorkloadConformance, check: str, prefix: str, seed: int, inference: bool,
                  frozen: bool = False) -> None:
    ctx = ("torch.inference_mode" if inference else "torch.enable_grad with no input requiring grad" if frozen else
           "torch.no_grad")
    run.generate(run.P, seed)
    # the loss alone is judged here: a row of small |A| (tiny, 2^-k) moves it by less than its allowance
    # (gallery frozen-logits-single-token-rows-halved: a single-token row of tiny A halved passed)
    run.P.write(audible_scalars(run, run.P))
    label = run._label(prefix)
    checks = (check,) if inference else (check, "no-mutation")
    # frozen: grad mode on, and `only` names no differentiable input, so none requires grad
    f = run.forward(label, run.P, checks, grad=frozen, inference=inference, only=() if frozen else None)
    exercised(run, "inference-mode" if inference else "frozen-all" if frozen else "no-grad")
    if f is None:
        return
    exported = run.export(label, run.out1, (check,), keep=False)
    if exported is None:
        return
    changes = {"forward": f["forward"]} if f["forward"] else {}
    if inference:  # judged here: the inputs after a call under inference_mode, bitwise
        if changes:
            run.P.restore()
    else:
        run.mutation(label, run.P, {"forward": f["forward"]})
    desc = exported["report"].get("loss")
    actual = float(run.out1.loss[0])
    expected = run.reference_loss(run.P.pristine)
    cmp = compare_loss(actual, expected, run.tol.loss, run.loss_floor(run.P.pristine))  # as judge's loss allowance
    ok = cmp.passed and desc is not None and "dtype" in desc and not (inference and changes)
    msg = (f"under {ctx} the loss {actual:.9g} matches {expected:.9g}" if ok else
           f"under {ctx}: the loss is not a tensor ({desc})" if not (desc and "dtype" in desc) else
           f"under {ctx}: |{actual:.9g} - {expected:.9g}| > {cmp.allowed:.3g}" if not cmp.passed else
           f"under {ctx}: {', '.join(changes['forward'])} changed during the call")
    evidence = {"loss": cmp.to_json(), "loss_description": desc, "finite": math.isfinite(actual),
                "value": json_float(actual)}
    if inference:
        evidence["changes"] = changes
    run.book.record(check, label, ok, msg, evidence)


def retained_graph(run: WorkloadConformance, c1: float, c2: float) -> None:
    """One forward, a backward with retain_graph=True (upstream c1), then torch.autograd.grad
    through the same graph again (upstream c2), as a second loss term or a gradient penalty does:
    both gradients must match the reference. A kernel that frees or scales in place what it saved
    for backward gives zeros, garbage or c1*c2 times the gradient the second time."""
    check = "retained-graph"
    checks = (check, "no-mutation")
    run.generate(run.P, run.seeds[0] ^ 0x2E7A1)
    label = run._label("RG")
    f = run.forward(label, run.P, checks)
    exercised(run, "retained-graph")
    if f is None:
        return
    for i, (c, method) in enumerate(((c1, "backward"), (c2, "autograd.grad"))):
        first = i == 0
        skipped = run.backward([label], [c], checks, method=method, retain=first)
        if skipped is None:
            return
        # The first export must keep the call alive in the worker: its graph is used again.
        exported = run.export(label, run.out1, (check,), keep=True if first else None)
        if exported is None:
            return
        if first:  # its outputs are replaced by the second backward's: nothing to re-read at the end
            run.kept = [k for k in run.kept if k.label != label]
        report = exported["report"]
        call = Call(label, run.P, c, float(run.out1.loss[0]), report.get("loss"), report.get("grads") or {}, run.out1.grads,
                    skipped.get(label), exported["kept"])
        J.finite(run, call)
        J.versus_reference(run, check, call, "first backward, retain_graph=True" if first else
                           "second backward through the retained graph, torch.autograd.grad")
    run.book.record("runs", label, True, "every call returned")
    run.mutation(label, run.P, {"forward": f["forward"], "backward": run.P.changes()})
    run.draws["retained_graph_upstream"] = [c1, c2]


REPEATED_CALLS = 100  # well past the ~30 calls a workload makes otherwise
REPEATED_SETS = 10  # distinct input sets, in turn: calls 1-10 judged against the reference, later ones
# compared bitwise with the judged call on the same set, and judged in full where they differ


def repeated_calls(run: WorkloadConformance) -> None:
    """REPEATED_CALLS calls at one small drawn shape, REPEATED_SETS input sets in turn (written into the
    same buffers before each call, so consecutive calls always differ), each call judged: a kernel
    that switches behaviour after N calls (a tuner settling, a counter) or caches its result by shape
    or address shows here. One finding for all of them.

    The first call on each set is judged against the reference; a later call on the same set whose
    outputs are bitwise equal to that call's gets its verdict (the judgment is a function of those
    bytes and the inputs), any other is judged against the reference in full: a kernel right the
    first time it sees inputs and wrong on a repeat fails (tests/gallery/wrong-on-repeated-inputs),
    a nondeterministic one is judged call by call and passes (docs/checks.md, "Judging cost").
    The worker's holdings after the first pass over the sets and after the last call feed
    no-resource-growth (isolation/resources.py)."""
    check = "repeated-calls"
    # Once per worker process: what it catches is a property of the process (a counter, a tuner, a
    # cache), and a hundred interpreted Triton calls cost ~30 s on 2 CPU cores. A restarted worker
    # (after a crash) is a new process and gets its hundred calls again.
    # One worker serves every member of an implementation (check.py): once per member in it, then.
    made_in = run.made_in("repeated_calls")
    if made_in is not None:
        run.book.not_applicable(check, f"made once per worker process: its {REPEATED_CALLS} calls ran in "
                                       f"workload {made_in}")
        return
    r = run.rng
    axes = small_axes(r, run.rw.axes)
    small = run.spec.resolve(run.rw.workload.model_copy(update={"axes": axes}))
    # Slots of their own: input-cases (K) holds a workload-sized set by now.
    if "RCI" not in run.extra_slots:
        run.RCI = InputSlot.create(run.session, "RCI", small.shapes, run.dtypes)
        run.RCO = OutputSlot.for_spec(run.session, "RCO", run.spec, small.shapes, run.dtypes)
        run.extra_slots += ["RCI", "RCO"]
    exercised(run, "repeated-calls")
    saved = run.rw, run.seq_next, run.width
    lead = run.spec.differentiable_input.name
    run.rw, run.seq_next, run.width = small, small.axes.get("seq_next"), run.groupings[lead].width(small)  # what judge() reads
    base = run.seeds[-1] ^ 0x4E9EA7ED
    bad: list[dict] = []
    mutated: dict | None = None
    done = 0
    sets: list[dict] = []  # the input sets' values (parent-owned)
    first: list[tuple] = []  # per set: (call number, loss, gradients copy, failure or None) of its judged call
    judged = 0
    held: list[dict] = []  # the worker's holdings after the first pass over the sets and after the last call
    try:
        for i in range(REPEATED_CALLS):
            j = i % REPEATED_SETS
            if j == len(sets):
                x = run.op.generate(run.spec, small, base + j, run.device, values=run.model.values)
                sets.append({k: v.clone() for k, v in x.tensors.items()})
            run.RCI.write(sets[j])
            label = run._label(f"RC{i + 1}")
            f = run.forward(label, run.RCI, (check,))
            if f is None:
                return
            # backward and export in one round trip, as every other call makes them (~10 ms a request on the
            # H200 host: a hundred fewer a member)
            done_call = run.backward_export(label, run.RCI, run.RCO, (check,), f, 1.0, "backward", None, keep=False)
            if done_call is None:
                return
            skipped, exported = done_call
            done += 1
            if done in (REPEATED_SETS, REPEATED_CALLS):
                sample = run.ask(("no-resource-growth",), label, op="resources")  # isolation/resources.py
                if sample is not None:
                    held.append(sample)
            changed = {k: v for k, v in (("forward", f["forward"]), ("backward", run.RCI.changes())) if v}
            if changed and mutated is None:
                mutated = {"call": i + 1, "changes": changed}
            report = exported["report"]
            call = Call(label, run.RCI, 1.0, float(run.RCO.loss[0]), report.get("loss"), report.get("grads") or {}, run.RCO.grads,
                        skipped.get(label))
            if call.missing:
                bad.append({"call": i + 1, "why": call.skipped_backward or "no gradient"})
                continue
            if j < len(first) and _same_outputs(first[j], call):
                if first[j][3] is not None:
                    bad.append({"call": i + 1, "why": f"the same outputs as call {first[j][0]}: {first[j][3]}"})
                continue
            loss_cmp, cmp = run.judge(call)
            judged += 1
            why = None if loss_cmp.passed and cmp.passed and cmp.nan == 0 else describe_outputs(loss_cmp, cmp)
            if why is not None:
                bad.append({"call": i + 1, "why": why})
            if j == len(first):
                first.append((i + 1, call.loss, {n: g.clone() for n, g in call.grads.items()}, why))
    finally:
        run.rw, run.seq_next, run.width = saved
        run.draws["repeated_calls"] = {"calls": done, "axes": axes, "input_sets": len(sets), "judged": judged}
        if done:
            run.book.record("runs", f"RC1..RC{done}", True, "every call returned")
    shape = list(small.shapes[lead])
    run.book.record(check, f"RC1..RC{done}", not bad,
                    f"{done} calls at shape {shape}, {len(sets)} input sets in turn: all match the reference" if not bad else
                    f"{len(bad)} of {done} calls at shape {shape} do not match the reference, first call "
                    f"{bad[0]['call']}: {bad[0]['why']}",
                    {"calls": done, "shape": shape, "input_sets": len(sets), "judged_in_full": judged,
                     "failing_calls": [b["call"] for b in bad][:50],
                     "first_failure": bad[0] if bad else None})
    if len(held) == 2:
        J.resource_growth(run, held[0], held[1], f"RC{REPEATED_SETS}..RC{done}", done - REPEATED_SETS)
    run.book.record("no-mutation", f"RC1..RC{done}", mutated is None,
                    "inputs bitwise unchanged in every repeated call" if mutated is None else
                    f"call RC{mutated['call']}: {', '.join(next(iter(mutated['changes'].values())))} changed",
                    mutated or {})


def _same_outputs(first: tuple, call: Call) -> bool:
    """Whether a call's loss and gradients are bitwise those of the judged call `first` on its inputs."""
    _, loss, grads, _ = first
    same_loss = call.loss == loss or (math.isnan(call.loss) and math.isnan(loss))
    return same_loss and set(grads) == set(call.grads) and all(bitwise_equal(grads[n], g) for n, g in call.grads.items())
