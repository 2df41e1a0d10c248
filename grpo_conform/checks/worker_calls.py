"""The engine's worker steps, mixed into `WorkloadConformance` (conformance.py): forward, backward and export
requests (one call, or several graphs held at once), each call's input and storage checks (no-mutation,
no-aliasing), and what a failed request records. The worker never sees a seed or a reference; the parent's
input slots are compared bitwise with their pristine copies after every step."""

from __future__ import annotations

from typing import Any

from grpo_conform.checks import local_inputs
from grpo_conform.checks.buffers import InputSlot, OutputSlot, UndrawnInputSet, overlap_text, storage_overlaps
from grpo_conform.checks.calls import GONE, Call, Kept, WorkerGone
from grpo_conform.isolation.session import WorkerFailure


class WorkerCalls:
    """Worker round trips of a conformance run (reads the run's session, spec, book, model, slots and draws)."""

    def _label(self, label: str) -> str:
        self._count += 1
        return f"{self.slot_tag}{':' if self.slot_tag else ''}{label}#{self._count}"

    def _fail(self, checks: tuple[str, ...], label: str, failure: WorkerFailure) -> None:
        self.book.failure(checks, label, failure)
        if failure.kind in GONE:
            raise WorkerGone(failure) from None

    def ask(self, checks: tuple[str, ...], label: str, **request: Any) -> dict[str, Any] | None:
        """One worker request outside a loss call (a re-export, the effects, the holdings): its reply, or
        None with the failure recorded against `checks` (a gone worker raises WorkerGone, as `_fail`)."""
        try:
            return self.session.request(**request)
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            return None

    def forward(self, label: str, slot: InputSlot, checks: tuple[str, ...], *, grad: bool = True,
                leaf: str = "leaf", poison: str | None = None, inference: bool = False,
                tie: dict[str, Any] | None = None, only: tuple[str, ...] | None = None,
                same: dict[str, list[str]] | None = None, omit: list[str] | None = None,
                prefill: dict[str, Any] | None = None, deterministic: bool = False,
                autocast: str | None = None) -> dict[str, Any] | None:
        """Forward only; the inputs are compared with the pristine copy right after it.
        `inference`: under torch.inference_mode instead of torch.no_grad (with grad=False); `tie`: a
        second use of an input in the graph (the worker's `_tied`: tied input embeddings); `same`, `omit`:
        an input passed as another's tensor, optional inputs left out; `prefill`: leaves whose .grad holds an
        output slot's gradient before the forward; `deterministic`: under torch's deterministic mode (the
        worker's op_forward); `autocast`: the forward under torch.autocast in that dtype (trainer_modes.py)."""
        if not slot.drawn:
            raise UndrawnInputSet(f"call {label}: input set {slot.name} was never drawn (no probe before it wrote "
                                  "values there): a probe's order or `needs` is wrong")
        extra = {"inference": True} if inference else {}
        extra.update({"tie": tie} if tie else {})
        extra.update({"same": same} if same else {})
        extra.update({"omit": omit} if omit else {})
        extra.update({"prefill": prefill} if prefill else {})
        extra.update({"deterministic": True} if deterministic else {})
        extra.update({"autocast": autocast} if autocast else {})
        # `only`: the differentiable inputs that require grad this call (the others frozen, as a trainer's)
        names = [g.input for g in self.spec.gradients if only is None or g.input in only]
        # the worker's own copies (local_inputs.py), drawn for every call so the stream never shifts
        if self._local_draws.is_local(checks):
            extra["local"], shared = local_inputs.copied(slot.tensors, names, leaf, grad)
            self.draws.setdefault("local_calls", []).append(label)
            if shared:
                self.draws.setdefault("local_left_shared", {})[label] = shared
        try:
            reply = self.session.request(op="forward", call=label, inputs=slot.name, params=self.model.call_values,
                                         grad=grad, gradients=names, leaf=leaf, poison=poison, **extra)
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            self.mutation(label, slot, {"after error": slot.changes()})
            return None
        return {"loss": reply.get("loss"), "forward": slot.changes()}

    def backward(self, labels: list[str], upstream: list[float], checks: tuple[str, ...],
                 method: str = "backward", poison: str | None = None, retain: bool = False) -> dict[str, str] | None:
        """`retain`: retain_graph=True, so that a second backward through the same graph can follow."""
        extra = {"retain": True} if retain else {}
        try:
            reply = self.session.request(op="backward", calls=labels, upstream=upstream, method=method, poison=poison,
                                         **extra)
        except WorkerFailure as failure:
            self._fail(checks, "/".join(labels), failure)
            return None
        return reply.get("skipped") or {}

    def export(self, label: str, out: OutputSlot, checks: tuple[str, ...], keep: bool | None = None) -> dict | None:
        keep = len(self.kept) < self.keep_budget if keep is None else keep
        out.clear()
        try:
            reply = self.session.request(op="export", call=label, outputs=out.name, keep=keep)
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            return None
        return self._exported(label, out, keep, reply.get("report", {}))

    def _exported(self, label: str, out: OutputSlot, keep: bool, report: dict) -> dict:
        self.exported[out.name] = label
        if keep:
            self.kept.append(Kept(label, self.fingerprint(out)))
        return {"report": report, "kept": keep}

    def backward_export(self, label: str, slot: InputSlot, out: OutputSlot, checks: tuple[str, ...], fwd: dict,
                         upstream: float, method: str, poison: str | None,
                         keep: bool | None) -> tuple[dict[str, str], dict] | None:
        """`backward` then `export` of one call in one round trip (a worker request costs ~10 ms on the
        H200 host, docs/timing.md). Failures as the two requests reported them: a failed backward has the
        inputs checked after it, a failed export not."""
        keep = len(self.kept) < self.keep_budget if keep is None else keep
        out.clear()
        try:
            reply = self.session.request(op="backward", calls=[label], upstream=[upstream], method=method,
                                         poison=poison, export={"call": label, "outputs": out.name, "keep": keep})
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            if failure.error.get("phase") != "export":
                self.mutation(label, slot, {"forward": fwd["forward"], "after error": slot.changes()})
            return None
        return reply.get("skipped") or {}, self._exported(label, out, keep, reply.get("report") or {})

    def call(self, label: str, slot: InputSlot, out: OutputSlot, checks: tuple[str, ...], *,
             upstream: float = 1.0, method: str = "backward", leaf: str = "leaf",
             poison: str | None = None, keep: bool | None = None, only: tuple[str, ...] | None = None,
             same: dict[str, list[str]] | None = None, omit: list[str] | None = None,
             prefill: dict[str, Any] | None = None, deterministic: bool = False,
             autocast: str | None = None) -> Call | None:
        """forward + backward + export, with the mutation and aliasing checks of the call; `only`: the
        differentiable inputs that require grad (the call's gradients are those, the others frozen);
        `same`, `omit`, `prefill`, `deterministic`, `autocast`: as `forward`."""
        label = self._label(label)
        fwd = self.forward(label, slot, checks, leaf=leaf, poison=poison, only=only, same=same, omit=omit,
                           prefill=prefill, deterministic=deterministic, autocast=autocast)
        if fwd is None:
            return None
        done = self.backward_export(label, slot, out, checks, fwd, upstream, method, poison, keep)
        if done is None:
            return None
        skipped, exported = done
        self.book.record("runs", label, True, "every call returned")
        self.mutation(label, slot, {"forward": fwd["forward"], "backward": slot.changes()})
        report = exported["report"]
        self.aliasing(label, report)
        grads = out.grads if only is None else {k: v for k, v in out.grads.items() if k in only}
        return Call(label, slot, upstream, float(out.loss[0]), report.get("loss"), report.get("grads") or {},
                    grads, skipped.get(label), exported["kept"])

    def mutation(self, label: str, slot: InputSlot, changed: dict[str, Any]) -> None:
        found = {phase: diff for phase, diff in changed.items() if diff}
        if found:
            first_phase = next(iter(found))
            names = ", ".join(found[first_phase])
            self.book.record("no-mutation", label, False, f"call {label}: {names} changed during {first_phase}",
                             {"changes": found})
            slot.restore()
        else:
            self.book.record("no-mutation", label, True, "inputs bitwise unchanged after forward and backward")

    def aliasing(self, label: str, report: dict[str, Any]) -> None:
        overlaps = storage_overlaps(report.get("storage", {}), [t.name for t in self.spec.inputs],
                                    [g.input for g in self.spec.gradients])
        if overlaps:
            o = overlaps[0]
            self.book.record("no-aliasing", label, False,
                             f"call {label}: {overlap_text(o)}",
                             {"overlaps": overlaps})
        else:
            self.book.record("no-aliasing", label, True, "no output storage overlaps an input")
