"""How the probes judge calls: each function records findings for named checks in the run's
book, with the evidence behind them. Everything here runs in the parent on data it owns."""

from __future__ import annotations

import math
from typing import Any

import torch

from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.compare import bitwise_equal, count_where, describe_outputs, first_difference, json_float, max_abs_diff
from grpo_conform.ops.grpo_logits.diagnosis import diagnose
from grpo_conform.isolation.resources import ALLOWED, growth
from grpo_conform.isolation.worker import POISON_BYTES


def poison_hits(t: torch.Tensor, byte: int) -> int:
    """Elements whose every byte is the poison byte: memory nobody wrote since it was poisoned."""
    raw = t.contiguous().view(torch.uint8).view(-1, t.element_size())
    step = 1 << 26
    return sum(int((raw[i : i + step] == byte).all(dim=1).sum()) for i in range(0, raw.shape[0], step))


def contract(run: WorkloadConformance, call: Call) -> list[str]:
    problems = []
    out_spec = run.spec.outputs[0]
    ld = call.loss_desc
    if ld is None or "dtype" not in ld:
        problems.append(f"the loss is {ld['type'] if ld else 'None'}, not a torch.Tensor")
    else:
        if not ld["exact_tensor"]:
            problems.append(f"the loss is a {ld['type']}, not exactly torch.Tensor")
        if ld.get("layout", "strided") != "strided":
            problems.append(f"the loss has layout {ld['layout']}, expected a dense (strided) tensor")
        if ld["dtype"] not in out_spec.dtypes:
            problems.append(f"loss dtype {ld['dtype']}, expected one of {list(out_spec.dtypes)}")
        accepted = [list(s) for s in out_spec.accept_shapes] or [[]]
        if ld["shape"] not in accepted:
            shape = "unknown (nested, or over 64 dimensions)" if ld["shape"] is None else ld["shape"]
            problems.append(f"loss shape {shape}, expected one of {accepted}")
        if ld["device"] != run.device.type:
            problems.append(f"loss on {ld['device']}, expected {run.device.type}")
    if call.skipped_backward:
        problems.append(f"backward not possible: {call.skipped_backward}")
    names = [g.input for g in run.spec.gradients]
    for name in names:
        problems += gradient_contract(name, call.grad_descs.get(name), call.slot.tensors[name], run.device.type,
                                      several=len(names) > 1, skipped=bool(call.skipped_backward))
    return problems


def gradient_contract(name: str, gd: dict[str, Any] | None, x: torch.Tensor, device: str, several: bool,
                      skipped: bool = False) -> list[str]:
    """What is wrong with the gradient of input `name` as the worker described it: it must exist
    and be exactly a torch.Tensor with the input's dtype, shape and device (what autograd
    accumulates into `.grad`). `several`: the spec has
    more than one gradient, so each message names its gradient (one gradient keeps its old texts)."""
    if gd is None:
        return [] if skipped else [f"backward left no gradient on {name}"]
    what = f"the gradient of {name}" if several else "the gradient"
    short = f"gradient of {name}" if several else "gradient"
    problems = []
    if not gd["exact_tensor"]:
        problems.append(f"{what} is a {gd['type']}, not exactly torch.Tensor")
    if gd.get("layout", "strided") != "strided":
        problems.append(f"{short} layout {gd['layout']}, expected strided (dense, as the {name} input)")
    want_dtype = str(x.dtype).replace("torch.", "")
    if gd.get("dtype") != want_dtype:
        problems.append(f"{short} dtype {gd.get('dtype')}, expected {want_dtype} (the {name} dtype)")
    if gd.get("shape") != list(x.shape):
        problems.append(f"{short} shape {gd.get('shape')}, expected {list(x.shape)}")
    if gd.get("device") != device:  # autograd keeps a leaf's gradient on its device: a guard, not a finding today
        problems.append(f"{short} on {gd.get('device')}, expected {device}")
    return problems


def plain(run: WorkloadConformance, call: Call) -> None:
    label = call.label
    problems = contract(run, call)
    run.book.record("contract", label, not problems, "; ".join(problems) or "loss and gradient as declared",
                    {"loss": call.loss_desc, "gradient": _described(call), "problems": problems})
    finite(run, call)
    rows = run.seq_next is not None  # gradient rows with zero sums and a last position: an operation with seq_next
    if len(call.missing) == len(call.grads):  # some but not all: the missing ones compare as NaN
        for check in ("loss", "gradient") + (("gradient-row-sums", "last-row-zero") if rows else ()):
            run.book.record(check, label, False, f"call {label}: no gradient to compare (see contract)")
        return
    loss_cmp, cmp = run.judge(call)
    cause = likely_cause(run, call, loss_cmp, cmp)
    said = f"; likely cause: {cause['summary']}" if cause and cause.get("matches") else ""
    run.book.record("loss", label, loss_cmp.passed,
                    f"call {label}: |{loss_cmp.actual:.9g} - {loss_cmp.expected:.9g}| "
                    f"{'<=' if loss_cmp.passed else '>'} {loss_cmp.allowed:.3g}" + said,
                    {**loss_cmp.to_json(), **({"likely_cause": cause} if cause else {})})
    run.book.record("gradient", label, cmp.passed, f"call {label}: {cmp.describe()}" + said,
                    {**cmp.evidence(), **({"likely_cause": cause} if cause else {})})
    if not rows:
        return
    rows_ok = cmp.row_sum_failures == 0
    run.book.record("gradient-row-sums", label, rows_ok,
                    f"call {label}: " + ("every row sums to ~0" if rows_ok else
                                         f"{cmp.row_sum_failures} rows do not sum to ~0"), cmp.row_sum_evidence())
    zero_ok = cmp.last_rows_nonzero == 0
    run.book.record("last-row-zero", label, zero_ok,
                    f"call {label}: " + ("last position exactly 0" if zero_ok else
                                         f"{cmp.last_rows_nonzero} non-zero values at the last position"),
                    cmp.last_row_evidence())


DIAGNOSES = 3  # failing calls a workload diagnoses at most (each costs one float64 pass per variant)


def likely_cause(run: WorkloadConformance, call: Call, loss_cmp, cmp) -> dict[str, Any] | None:
    """When the loss or the gradient failed: which neighbouring semantics of the family the outputs
    equal (`grpo_conform.diagnosis`), within the check's own allowances. Once per workload (the
    first failing call, or the next ones while none matched, at most DIAGNOSES), never on a passing call.
    A first failing call can be one the variants cannot explain (a mask layout that hides the bug, a
    tie the variant breaks the other way); the next failing call gets its chance."""
    tried = run.state.setdefault("diagnosed", [])
    if (loss_cmp.passed and cmp.passed) or not run.op.diagnosed or cmp.single is None or "matched" in run.state \
            or len(tried) >= DIAGNOSES:
        return None  # (the diagnosis knows one gradient: grpo-logits')
    tried.append(call.label)
    try:
        found = diagnose(call.slot.pristine, run.model.params, call.loss, call.grad, loss_cmp.allowed,
                         _variant_allowance(cmp), upstream=call.upstream)
    except (RuntimeError, ValueError) as exc:  # a diagnosis that cannot run must not hide the verdict
        return {"summary": f"not evaluated: {exc}", "matches": []}
    if found.matches:
        run.state["matched"] = call.label
    return found.to_json()


def _variant_allowance(cmp) -> float:
    """The relative Frobenius allowance a variant's gradient is matched within: the check's own. Where
    the reference gradient is exactly zero (every token masked or dropped) the check allows no
    difference at all, which no float32 kernel meets against a non-zero variant: then the check's
    relative part (its rounding allowance for a non-zero gradient) applies."""
    allowed = cmp.frobenius_allowed
    if allowed == 0.0:
        allowed = cmp.single.tol.frobenius_rtol * cmp.single.slack
    return max(allowed, 1e-6)


def versus_reference(run: WorkloadConformance, check: str, call: Call, how: str) -> None:
    """One check judged by loss and gradient against the reference (upstream scalar applied)."""
    if call.missing:
        why = call.skipped_backward or f"backward left no gradient on {', '.join(call.missing)}"
        run.book.record(check, call.label, False, f"call {call.label} ({how}): no gradient: {why}",
                        {"how": how, "loss": call.loss_desc})
        return
    # torch.autograd.grad hands the caller the backward's own tensor (no .grad accumulation makes it a
    # plain one): a tensor subclass or a sparse gradient reaches the caller only on such calls.
    odd = [f"the gradient of {name} is a {d['type']} with layout {d.get('layout', 'strided')}, not a plain dense "
           "torch.Tensor" for name, d in call.grad_descs.items()
           if d is not None and (not d.get("exact_tensor") or d.get("layout", "strided") != "strided")]
    loss_cmp, cmp = run.judge(call)
    ok = cmp.passed and loss_cmp.passed and cmp.nan == 0 and not odd
    # a probe's own call (a declared case, an upstream scalar, a non-leaf input) gets the neighbouring
    # semantics too: its parameters can be the only ones where a variant differs (one process, factor 8)
    cause = None if ok or odd else likely_cause(run, call, loss_cmp, cmp)
    said = f"; likely cause: {cause['summary']}" if cause and cause.get("matches") else ""
    run.book.record(check, call.label, ok, f"call {call.label} ({how}): " + (
        "matches the reference" if ok else "; ".join(odd) or describe_outputs(loss_cmp, cmp) + said),
        {"how": how, "upstream": call.upstream, "gradient": cmp.evidence(), "loss": loss_cmp.to_json(),
         **({"likely_cause": cause} if cause else {})})


def _described(call: Call) -> Any:
    """The worker's description of the gradient (one), or of each gradient by name (several)."""
    return call.grad_desc if len(call.grads) == 1 else {name: call.grad_descs.get(name) for name in call.grads}


def _per_gradient(call: Call, count) -> tuple[int, str]:
    """(total of `count` over the call's gradients that backward produced, "" or " (<name> n, ...)"
    naming each gradient with a non-zero count when there are several)."""
    counts = {name: count(g) for name, g in call.grads.items() if call.grad_descs.get(name) is not None}
    named = [f"{name} {n}" for name, n in counts.items() if n] if len(call.grads) > 1 else []
    return sum(counts.values()), f" ({', '.join(named)})" if named else ""


def finite(run: WorkloadConformance, call: Call) -> None:
    nan, nan_where = _per_gradient(call, lambda g: count_where(g, torch.isnan))
    inf, inf_where = _per_gradient(call, lambda g: count_where(g, torch.isinf))
    loss_ok = math.isfinite(call.loss) or call.loss_desc is None
    ok = nan == 0 and inf == 0 and loss_ok
    run.book.record("finite", call.label, ok, f"call {call.label}: " + (
        "all outputs finite" if ok else f"gradient has {nan} NaN{nan_where} and {inf} Inf{inf_where}; loss {call.loss}"),
        {"gradient_nan": nan, "gradient_inf": inf, "loss": json_float(call.loss)})


def finite_under_poison(run: WorkloadConformance, call: Call) -> None:
    # the 0xFF poison reads as NaN in every float dtype; a gradient backward never gave counts in full
    nan = sum(count_where(g, torch.isnan) for g in call.grads.values())
    where = [f"{n} {count_where(g, torch.isnan)}" for n, g in call.grads.items()
             if len(call.grads) > 1 and count_where(g, torch.isnan)]
    ok = nan == 0 and math.isfinite(call.loss)
    run.book.record("stale-output", call.label, ok,
                    "no NaN after the allocator was poisoned with NaN" if ok else
                    f"{nan} gradient elements still hold the NaN poison: never written"
                    + (f" ({', '.join(where)})" if where else ""),
                    {"poison": "0xFF bytes (NaN)", "gradient_nan": nan, "loss": json_float(call.loss)})


def stale_huge(run: WorkloadConformance, b: Call) -> None:
    loss_cmp, grad_cmp = run.judge(b)
    each = {name: poison_hits(g, POISON_BYTES["huge"]) for name, g in b.grads.items()}
    hits = sum(each.values())
    where = [f"{n} {k}" for n, k in each.items() if k] if len(each) > 1 else []
    ok = loss_cmp.passed and grad_cmp.passed and grad_cmp.nan == 0 and hits == 0
    why = (f"{hits} gradient elements hold the allocator's 0x7B poison: never written"
           + (f" ({', '.join(where)})" if where else "") if hits else
           "outputs depend on what the allocator held: " + describe_outputs(loss_cmp, grad_cmp))
    run.book.record("stale-output", b.label, ok, "outputs match the reference under both poisons" if ok else why,
                    {"poison": "0x7B bytes (huge finite)", "poison_hits": hits,
                     "gradient": grad_cmp.evidence(), "loss": loss_cmp.to_json()})


def fresh(run: WorkloadConformance, call: Call, how: str) -> None:
    if call.missing:
        return
    loss_cmp, cmp = run.judge(call)
    ok = cmp.passed and loss_cmp.passed
    run.book.record("freshness", call.label, ok, f"call {call.label} ({how}): " + (
        "results follow the inputs" if ok else "results do not follow the new inputs: " + describe_outputs(loss_cmp, cmp)),
        {"how": how, "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})


def _by_name(g: torch.Tensor | dict[str, torch.Tensor], call_grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An earlier call's gradient(s) by name: a bare tensor is the only gradient's."""
    if isinstance(g, dict):
        return g
    (name,) = call_grads
    return {name: g}


def determinism(run: WorkloadConformance, g_a: torch.Tensor | dict[str, torch.Tensor], loss_a: float, b: Call) -> None:
    """`g_a`: call A's gradient (one) or gradients by name, compared with call B's each by name."""
    g_a = _by_name(g_a, b.grads)
    same = all(bitwise_equal(g_a[n], g) for n, g in b.grads.items()) and (
        loss_a == b.loss or (math.isnan(loss_a) and math.isnan(b.loss)))
    evidence = {"bitwise_equal": same, "max_abs_diff": json_float(max(max_abs_diff(g_a[n], g) for n, g in b.grads.items())),
                "loss_abs_diff": json_float(abs(loss_a - b.loss))}
    run.book.record("determinism", "A/B", True, "bitwise equal across identical calls" if same else
                    f"not bitwise deterministic: max difference {evidence['max_abs_diff']}", evidence)


def reread_first(run: WorkloadConformance, when: str) -> None:
    """Re-read call A's outputs (kept alive in the worker) and compare them bitwise."""
    label, g_a, loss_a = run.state["A"]
    if not any(k.label == label for k in run.kept):  # no memory to keep it: nothing to re-read, no verdict
        run.book.skip("no-output-reuse", f"call A's outputs could not be kept on this device to re-read {when}")
        return
    if run.ask(("no-output-reuse",), f"re-read {when}", op="reexport", call=label, outputs=run.out2.name) is None:
        return
    loss_now = float(run.out2.loss[0])
    g_a = _by_name(g_a, run.out2.grads)
    diffs = {n: first_difference(g, g_a[n]) for n, g in run.out2.grads.items()}
    diffs = {n: d for n, d in diffs.items() if d is not None}
    diff = next(iter(diffs.values())) if len(run.out2.grads) == 1 and diffs else (diffs or None)
    loss_changed = not (loss_now == loss_a or (math.isnan(loss_now) and math.isnan(loss_a)))
    ok = not diffs and not loss_changed
    what = []
    for n, d in diffs.items():
        what.append(f"{d['differing']} gradient elements" + (f" of {n}" if len(run.out2.grads) > 1 else ""))
    if loss_changed:
        what.append(f"the loss ({loss_a!r} -> {loss_now!r})")
    run.book.record("no-output-reuse", when, ok, f"outputs of call A unchanged {when}" if ok else
                    f"outputs of call A were overwritten {when}: " + " and ".join(what),
                    {"gradient": diff, "loss_before": json_float(loss_a), "loss_now": json_float(loss_now)})


def end_reread(run: WorkloadConformance) -> None:
    changed: list[dict[str, Any]] = []
    for kept in run.kept:
        if run.ask(("no-output-reuse",), f"re-read {kept.label}", op="reexport", call=kept.label,
                   outputs=run.out1.name) is None:
            return
        now = run.fingerprint(run.out1)
        if now != kept.fingerprint:
            changed.append({"call": kept.label, "loss_changed": now[0] != kept.fingerprint[0],
                            "gradient_changed": now[1] != kept.fingerprint[1]})
    n = len(run.kept)
    run.draws["kept_outputs"] = n
    if n == 0:  # nothing could be kept (no memory for one more gradient): no evidence, never a pass
        run.book.skip("no-output-reuse", "no earlier output could be kept on this device to re-read")
        return
    ok = not changed
    run.book.record("no-output-reuse", "end", ok, f"all {n} kept outputs unchanged at the end of the workload" if ok
                    else f"{len(changed)} of {n} kept outputs changed by later calls, first {changed[0]['call']}",
                    {"kept_calls": [k.label for k in run.kept], "changed": changed})


def side_effects(run: WorkloadConformance) -> None:
    reply = run.ask(("no-global-side-effects",), "effects", op="effects")
    if reply is None:
        return
    effects = reply.get("effects") or []
    if not effects:
        run.book.record("no-global-side-effects", "end", True, "every call left the process's global state as it "
                        "found it (dtype, grad mode, flags, threads, random generators)", {})
        return
    first = effects[0]
    run.book.record("no-global-side-effects", first["call"], False,
                    f"call {first['call']} changed {first['state']}: {first['before']} -> {first['after']}"
                    + (f" (and {len(effects) - 1} more)" if len(effects) > 1 else "")
                    + "; a caller's training step sees it (the worker put it back after recording)",
                    {"effects": effects})


def resource_growth(run: WorkloadConformance, first: dict, last: dict, span: str, calls: int) -> None:
    grew = growth(first, last)
    measured = {k: {"first": first.get(k), "last": last.get(k)} for k in ALLOWED}
    if not grew:
        run.book.record("no-resource-growth", span, True, f"over {calls} calls no file descriptors, threads, tensors, "
                        "CUDA memory or frozen objects were kept", {"calls": calls, "measured": measured, "allowed": ALLOWED})
        return
    said = "; ".join(f"{k} {v['first']} -> {v['last']} (allowed +{v['allowed']})" for k, v in grew.items())
    run.book.record("no-resource-growth", span, False,
                    f"over {calls} calls the worker's holdings grew: {said}; likely cause: something kept per call "
                    "(a list of outputs or graphs, a cache keyed by address, a file or thread opened per call; frozen "
                    "objects: gc.freeze() called by the implementation, which hides what it keeps from the count)",
                    {"calls": calls, "grew": grew, "measured": measured, "allowed": ALLOWED})


def adversarial(run: WorkloadConformance, i: Call, profiles) -> None:
    loss_cmp, cmp = run.judge(i)
    ok = cmp.passed and loss_cmp.passed and cmp.nan == 0 and cmp.inf == 0
    run.book.record("adversarial-inputs", i.label, ok,
                    f"profiles {', '.join(profiles)}: " + ("match the reference" if ok else describe_outputs(loss_cmp, cmp)),
                    {"profiles": list(profiles), "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})
