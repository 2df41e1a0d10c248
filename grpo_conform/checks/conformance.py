"""The conformance run of one workload: a fixed sequence of calls, each judged in the parent.

Calls (all forward + backward, each compared with the float64 reference of its own inputs):
  A  seed 1 in buffer set P, allocator poisoned with NaN        plain checks, stale-output
  B  same inputs, allocator poisoned with a huge finite pattern stale-output, determinism;
                                                                  then A's outputs are re-read
  C  advantages negated, written in place into P                advantage-sign, freshness
  D  seed 2 in a second buffer set Q (new addresses)            plain checks, freshness;
                                                                  then A's outputs are re-read
  E  D with one sequence's advantage set to 0                   zero-advantage
  F  D with one logits row redrawn                              row-locality
  G  D with logits[:, S, :] poisoned (NaN, then huge)           last-row-ignored
  I  seed 3, adversarial row profiles (up to 1e4)               adversarial-inputs
  +  further seeds when the workload asks for more than two    plain checks
Every call: inputs compared bitwise with the parent's pristine copy after forward and after
backward (no-mutation), storage ranges of outputs vs inputs (no-aliasing), finiteness.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch

from grpo_conform import inputs as gen
from grpo_conform.checks.book import CheckBook
from grpo_conform.checks.buffers import InputSlot, OutputSlot
from grpo_conform.checks.registry import CONFORMANCE_CHECKS
from grpo_conform.compare import GradientComparator, bitwise_equal, compare_loss, first_difference, json_float, max_abs_diff
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.isolation.worker import POISON_BYTES
from grpo_conform.reference import GrpoParameters, reference_gradient, reference_loss, row_scales, rows_per_chunk
from grpo_conform.spec import ResolvedWorkload, Spec

PLAIN = ("runs", "contract", "loss", "gradient", "gradient-row-sums", "last-row-zero", "finite",
         "no-mutation", "no-aliasing")
GONE = ("timeout", "crash", "cuda-error", "protocol")


def poison_hits(t: torch.Tensor, byte: int) -> int:
    """Elements whose every byte is the poison byte: memory nobody wrote since it was poisoned."""
    raw = t.contiguous().view(torch.uint8).view(-1, t.element_size())
    step = 1 << 26
    return sum(int((raw[i : i + step] == byte).all(dim=1).sum()) for i in range(0, raw.shape[0], step))


class _WorkerGone(Exception):
    def __init__(self, failure: WorkerFailure):
        self.failure = failure


@dataclass
class Call:
    label: str
    loss: float
    loss_desc: dict[str, Any] | None
    grad_desc: dict[str, Any] | None
    grad: torch.Tensor  # the output slot's buffer: valid until the next call into that slot
    skipped_backward: str | None


class WorkloadConformance:
    def __init__(self, session: WorkerSession, spec: Spec, resolved: ResolvedWorkload, seeds: list[int]):
        self.session, self.spec, self.rw, self.seeds = session, spec, resolved, seeds
        self.params = GrpoParameters.from_mapping(spec.parameter_values)
        logits_dtype = resolved.dtypes.get("logits", spec.input("logits").dtypes[0])
        self.tol = spec.tolerance(logits_dtype)
        self.seq_next = resolved.axes["seq_next"]
        self.vocab = resolved.shapes["logits"][-1]
        self.book = CheckBook(CONFORMANCE_CHECKS)
        self.rng = random.Random(seeds[0] ^ 0x9E3779B97F4A7C15)
        self.device = session.device

    # -- the sequence -----------------------------------------------------------------------
    def run(self):
        rw = self.rw
        dtypes = {t.name: gen.torch_dtype(rw.dtypes.get(t.name, t.dtypes[0])) for t in self.spec.inputs}
        s = self.session
        self.P = InputSlot.create(s, "P", rw.shapes, dtypes)
        self.Q = InputSlot.create(s, "Q", rw.shapes, dtypes)
        self.out1 = OutputSlot.create(s, "O1", rw.shapes["logits"], dtypes["logits"])
        self.out2 = OutputSlot.create(s, "O2", rw.shapes["logits"], dtypes["logits"])
        try:
            self._calls()
        except _WorkerGone as gone:
            self.book.skip_rest(f"not run: the worker was lost ({gone.failure.kind}) before this check")
        finally:
            if s.alive:  # the worker's mappings pin CUDA IPC memory in this process until dropped
                try:
                    s.request(op="release")
                    for slot in ("P", "Q", "O1", "O2"):
                        s.request(op="unbind", slot=slot)
                except WorkerFailure:
                    pass
        return self.book.outcomes()

    def _calls(self) -> None:
        P, Q = self.P, self.Q
        gen.generate(self.spec, self.rw, self.seeds[0], self.device, out=P.tensors)
        P.commit()
        a = self._call("A", P, self.out1, PLAIN + ("stale-output",), poison="nan", keep="kA")
        g_a = loss_a = None
        if a is not None:
            self._plain(a, P)
            self._finite_under_poison(a)
            g_a, loss_a = a.grad.clone(), a.loss
        b = self._call("B", P, self.out1, ("stale-output", "determinism", "finite"), poison="huge")
        if b is not None:
            loss_cmp, grad_cmp = self._reference(b, P)
            hits = poison_hits(b.grad, POISON_BYTES["huge"])
            ok = loss_cmp.passed and grad_cmp.passed and grad_cmp.nan == 0 and hits == 0
            why = (f"{hits} gradient elements hold the allocator's 0x7B poison: never written" if hits else
                   "outputs depend on what the allocator held: " + grad_cmp.describe())
            self.book.record("stale-output", "B", ok, "outputs match the reference under both poisons" if ok else why,
                             {"poison": "0x7B bytes (huge finite)", "poison_hits": hits,
                              "gradient": grad_cmp.evidence(), "loss": loss_cmp.to_json()})
            self._finite("B", b)
            if g_a is not None:
                self._determinism(g_a, loss_a, b)

        # C: advantages negated, written in place (same addresses as A).
        P.tensors["advantages"].neg_()
        P.commit()
        c = self._call("C", P, self.out1, ("advantage-sign", "freshness", "finite", "no-mutation", "no-aliasing"))
        if c is not None:
            self._fresh("C", c, P, "in place, same addresses")
            self._finite("C", c)
            if g_a is not None:
                rel = self._relation(c.grad, -g_a, P.pristine["advantages"])  # negation is exact in any float dtype
                self.book.record("advantage-sign", "C", rel.passed,
                                 "negated advantages negate the gradient" if rel.passed else
                                 "negating the advantages did not negate the gradient: " + rel.describe(),
                                 {"compared_with": "-gradient of call A", **rel.evidence()})
        if g_a is not None:
            self._reread("after C", g_a, loss_a)

        # D: a second seed in new buffers.
        gen.generate(self.spec, self.rw, self.seeds[1 % len(self.seeds)], self.device, out=Q.tensors)
        Q.commit()
        d = self._call("D", Q, self.out2, PLAIN + ("freshness",))
        g_d = loss_d = None
        if d is not None:
            self._plain(d, Q)
            self._fresh("D", d, Q, "new buffers, new values")
            g_d, loss_d = d.grad.clone(), d.loss
        if g_a is not None:
            self._reread("after D", g_a, loss_a)
        del g_a

        self._zero_advantage(Q)
        if g_d is not None:
            self._row_locality(Q, g_d)
            self._last_row(Q, g_d, loss_d)
        else:
            for check in ("row-locality", "last-row-ignored"):
                self.book.skip(check, "call D did not complete")
        del g_d
        self._adversarial(P)
        for i, seed in enumerate(self.seeds[2:], start=1):
            gen.generate(self.spec, self.rw, seed, self.device, out=P.tensors)
            P.commit()
            extra = self._call(f"S{i}", P, self.out1, PLAIN)
            if extra is not None:
                self._plain(extra, P)

    # -- one call ---------------------------------------------------------------------------
    def _call(self, label: str, slot: InputSlot, out: OutputSlot, checks: tuple[str, ...],
              poison: str | None = None, keep: str | None = None) -> Call | None:
        out.clear()
        changed: dict[str, Any] = {}

        def after_forward(_desc: Any) -> None:
            changed["forward"] = slot.changes()

        try:
            report = self.session.call(slot.name, out.name, "full", poison, keep, after_forward)
        except WorkerFailure as failure:
            self.book.failure(checks, label, failure)
            if failure.kind in GONE:
                raise _WorkerGone(failure) from None
            self._mutation(label, slot, {**changed, "after error": slot.changes()})
            return None
        changed["backward"] = slot.changes()
        self.book.record("runs", label, True, "every call returned")
        self._mutation(label, slot, changed)
        self._aliasing(label, report)
        loss = float(out.loss[0])
        return Call(label, loss, report.get("loss"), report.get("grad"), out.grad, report.get("backward_skipped"))

    def _mutation(self, label: str, slot: InputSlot, changed: dict[str, Any]) -> None:
        found = {phase: diff for phase, diff in changed.items() if diff}
        if found:
            first_phase = next(iter(found))
            names = ", ".join(found[first_phase])
            self.book.record("no-mutation", label, False, f"call {label}: {names} changed during {first_phase}",
                             {"changes": found})
            slot.restore()
        else:
            self.book.record("no-mutation", label, True, "inputs bitwise unchanged after forward and backward")

    def _aliasing(self, label: str, report: dict[str, Any]) -> None:
        storage = report.get("storage", {})
        overlaps = []
        for out_name in ("loss", "grad"):
            r = storage.get(out_name)
            if not r:
                continue
            for in_name in (t.name for t in self.spec.inputs):
                q = storage.get(in_name)
                if q and r[0] < q[0] + q[1] and q[0] < r[0] + r[1]:
                    overlaps.append({"output": out_name, "input": in_name, "output_range": r, "input_range": q})
        if overlaps:
            o = overlaps[0]
            self.book.record("no-aliasing", label, False,
                             f"call {label}: {o['output']} shares storage with input {o['input']}",
                             {"overlaps": overlaps})
        else:
            self.book.record("no-aliasing", label, True, "no output storage overlaps an input")

    # -- judging ----------------------------------------------------------------------------
    def _reference(self, call: Call, slot: InputSlot):
        x = slot.pristine
        ref_loss = reference_loss(x["logits"], x["completion_ids"], x["advantages"], self.params)
        cmp = GradientComparator(self.tol.gradient, self.seq_next, self.vocab)
        flat = call.grad.view(-1, self.vocab)
        for chunk in reference_gradient(x["logits"], x["completion_ids"], x["advantages"], self.params):
            cmp.update(chunk.start, flat[chunk.start : chunk.stop], chunk.values, chunk.scale)
        return compare_loss(call.loss, ref_loss, self.tol.loss), cmp

    def _relation(self, actual: torch.Tensor, expected: torch.Tensor, advantages: torch.Tensor) -> GradientComparator:
        """Compare two outputs of the implementation (both rounded, hence twice the slack)."""
        cmp = GradientComparator(self.tol.gradient, self.seq_next, self.vocab, slack=2.0)
        a, e = actual.view(-1, self.vocab), expected.view(-1, self.vocab)
        scales = row_scales(advantages, self.seq_next, self.params)
        step = rows_per_chunk(self.vocab)
        for start in range(0, a.shape[0], step):
            cmp.update(start, a[start : start + step], e[start : start + step], scales[start : start + step])
        return cmp

    def _contract(self, call: Call) -> list[str]:
        problems = []
        out_spec, logits = self.spec.outputs[0], self.P.tensors["logits"]
        ld = call.loss_desc
        if ld is None or "dtype" not in ld:
            problems.append(f"the loss is {ld['type'] if ld else 'None'}, not a torch.Tensor")
        else:
            if not ld["exact_tensor"]:
                problems.append(f"the loss is a {ld['type']}, not exactly torch.Tensor")
            if ld["dtype"] not in out_spec.dtypes:
                problems.append(f"loss dtype {ld['dtype']}, expected one of {list(out_spec.dtypes)}")
            accepted = [list(s) for s in out_spec.accept_shapes] or [[]]
            if ld["shape"] not in accepted:
                problems.append(f"loss shape {ld['shape']}, expected one of {accepted}")
            if ld["device"] != self.device.type:
                problems.append(f"loss on {ld['device']}, expected {self.device.type}")
        if call.skipped_backward:
            problems.append(f"backward not possible: {call.skipped_backward}")
        gd = call.grad_desc
        if gd is None and not call.skipped_backward:
            problems.append("backward left no gradient on logits")
        elif gd is not None:
            if not gd["exact_tensor"]:
                problems.append(f"the gradient is a {gd['type']}, not exactly torch.Tensor")
            want_dtype = str(logits.dtype).replace("torch.", "")
            if gd["dtype"] != want_dtype:
                problems.append(f"gradient dtype {gd['dtype']}, expected {want_dtype} (the logits dtype)")
            if gd["shape"] != list(logits.shape):
                problems.append(f"gradient shape {gd['shape']}, expected {list(logits.shape)}")
        return problems

    def _plain(self, call: Call, slot: InputSlot) -> None:
        label = call.label
        problems = self._contract(call)
        self.book.record("contract", label, not problems, "; ".join(problems) or "loss and gradient as declared",
                         {"loss": call.loss_desc, "gradient": call.grad_desc, "problems": problems})
        self._finite(label, call)
        if call.grad_desc is None:
            for check in ("loss", "gradient", "gradient-row-sums", "last-row-zero"):
                self.book.record(check, label, False, f"call {label}: no gradient to compare (see contract)")
            return
        loss_cmp, cmp = self._reference(call, slot)
        self.book.record("loss", label, loss_cmp.passed,
                         f"call {label}: |{loss_cmp.actual:.9g} - {loss_cmp.expected:.9g}| "
                         f"{'<=' if loss_cmp.passed else '>'} {loss_cmp.allowed:.3g}", loss_cmp.to_json())
        self.book.record("gradient", label, cmp.passed, f"call {label}: {cmp.describe()}", cmp.evidence())
        rows_ok = cmp.row_sum_failures == 0
        self.book.record("gradient-row-sums", label, rows_ok,
                         f"call {label}: " + ("every row sums to ~0" if rows_ok else
                                              f"{cmp.row_sum_failures} rows do not sum to ~0"),
                         cmp.row_sum_evidence())
        zero_ok = cmp.last_rows_nonzero == 0
        self.book.record("last-row-zero", label, zero_ok,
                         f"call {label}: " + ("last position exactly 0" if zero_ok else
                                              f"{cmp.last_rows_nonzero} non-zero values at the last position"),
                         cmp.last_row_evidence())

    def _finite(self, label: str, call: Call) -> None:
        nan = int(torch.isnan(call.grad).sum()) if call.grad_desc is not None else 0
        inf = int(torch.isinf(call.grad).sum()) if call.grad_desc is not None else 0
        loss_ok = math.isfinite(call.loss) or call.loss_desc is None
        ok = nan == 0 and inf == 0 and loss_ok
        self.book.record("finite", label, ok, f"call {label}: " + ("all outputs finite" if ok else
                         f"gradient has {nan} NaN and {inf} Inf; loss {call.loss}"),
                         {"gradient_nan": nan, "gradient_inf": inf, "loss": json_float(call.loss)})

    def _finite_under_poison(self, call: Call) -> None:
        nan = int(torch.isnan(call.grad).sum())  # the 0xFF poison reads as NaN in every float dtype
        ok = nan == 0 and math.isfinite(call.loss)
        self.book.record("stale-output", call.label, ok,
                         "no NaN after the allocator was poisoned with NaN" if ok else
                         f"{nan} gradient elements still hold the NaN poison: never written",
                         {"poison": "0xFF bytes (NaN)", "gradient_nan": nan, "loss": json_float(call.loss)})

    def _fresh(self, label: str, call: Call, slot: InputSlot, how: str) -> None:
        if call.grad_desc is None:
            return
        loss_cmp, cmp = self._reference(call, slot)
        ok = cmp.passed and loss_cmp.passed
        self.book.record("freshness", label, ok, f"call {label} ({how}): " + ("results follow the inputs" if ok
                         else "results do not follow the new inputs: " + cmp.describe()),
                         {"how": how, "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})

    def _determinism(self, g_a: torch.Tensor, loss_a: float, b: Call) -> None:
        same = bitwise_equal(g_a, b.grad) and (loss_a == b.loss or (math.isnan(loss_a) and math.isnan(b.loss)))
        evidence = {"bitwise_equal": same, "max_abs_diff": json_float(max_abs_diff(g_a, b.grad)),
                    "loss_abs_diff": json_float(abs(loss_a - b.loss))}
        self.book.record("determinism", "A/B", True,
                         "bitwise equal across identical calls" if same else
                         f"not bitwise deterministic: max difference {evidence['max_abs_diff']}", evidence)

    def _reread(self, when: str, g_a: torch.Tensor | None, loss_a: float) -> None:
        try:
            self.session.request(op="reread", keep="kA", outputs="O2")
        except WorkerFailure as failure:
            self.book.failure(("no-output-reuse",), f"re-read {when}", failure)
            if failure.kind in GONE:
                raise _WorkerGone(failure) from None
            return
        loss_now = float(self.out2.loss[0])
        diff = first_difference(self.out2.grad, g_a) if g_a is not None else None
        loss_changed = not (loss_now == loss_a or (math.isnan(loss_now) and math.isnan(loss_a)))
        ok = diff is None and not loss_changed
        what = []
        if diff is not None:
            what.append(f"{diff['differing']} gradient elements")
        if loss_changed:
            what.append(f"the loss ({loss_a!r} -> {loss_now!r})")
        self.book.record("no-output-reuse", when, ok,
                         f"outputs of call A unchanged {when}" if ok else
                         f"outputs of call A were overwritten {when}: " + " and ".join(what),
                         {"gradient": diff, "loss_before": json_float(loss_a), "loss_now": json_float(loss_now)})

    # -- metamorphic calls ------------------------------------------------------------------
    def _zero_advantage(self, Q: InputSlot) -> None:
        batch = self.rw.axes["batch"]
        b = self.rng.randrange(batch)
        original = Q.tensors["advantages"].clone()
        Q.tensors["advantages"][b] = 0.0
        Q.commit()
        e = self._call("E", Q, self.out1, ("zero-advantage", "finite", "no-mutation", "no-aliasing"))
        if e is not None:
            self._finite("E", e)
            nonzero = int((e.grad[b] != 0).sum())
            loss_cmp, cmp = self._reference(e, Q)
            ok = nonzero == 0 and cmp.passed and loss_cmp.passed
            msg = (f"advantage[{b}] = 0 gives an exactly zero gradient for sequence {b}" if ok else
                   f"advantage[{b}] = 0: {nonzero} non-zero gradient values in sequence {b}" if nonzero else
                   "the other sequences do not match the reference: " + cmp.describe())
            self.book.record("zero-advantage", "E", ok, msg,
                             {"sequence": b, "nonzero": nonzero, "gradient": cmp.evidence()})
        Q.tensors["advantages"].copy_(original)
        Q.commit()

    def _row_locality(self, Q: InputSlot, g_d: torch.Tensor) -> None:
        batch, seq = self.rw.axes["batch"], self.rw.axes["seq"]
        b, t = self.rng.randrange(batch), self.rng.randrange(seq)
        original = Q.tensors["logits"][b, t].clone()
        g = torch.Generator(device=self.device).manual_seed(self.rng.getrandbits(62))
        fresh = torch.randn(self.vocab, generator=g, device=self.device) * 2.0
        Q.tensors["logits"][b, t] = fresh.to(original.dtype)
        Q.commit()
        f = self._call("F", Q, self.out1, ("row-locality", "finite", "no-mutation", "no-aliasing"))
        if f is not None:
            self._finite("F", f)
            changed_row = b * self.seq_next + t
            differs = self._differing_rows(f.grad, g_d, Q.pristine["advantages"])
            others = [r for r in differs if r != changed_row]
            row_changed = changed_row in differs
            _, cmp = self._reference(f, Q)
            ok = not others and row_changed and cmp.passed
            if others:
                r = others[0]
                msg = (f"changing logits row ({b}, {t}) changed {len(others)} other gradient rows, "
                       f"first ({r // self.seq_next}, {r % self.seq_next})")
            elif not row_changed:
                msg = f"changing logits row ({b}, {t}) did not change its gradient row"
            elif not cmp.passed:
                msg = "the changed row does not match the reference: " + cmp.describe()
            else:
                msg = f"changing logits row ({b}, {t}) changed that gradient row only"
            self.book.record("row-locality", "F", ok, msg,
                             {"changed_row": [b, t], "other_rows_changed": len(others), "gradient": cmp.evidence()})
        Q.tensors["logits"][b, t] = original
        Q.commit()

    def _differing_rows(self, a: torch.Tensor, e: torch.Tensor, advantages: torch.Tensor) -> list[int]:
        """Flattened rows where two outputs differ beyond twice the element tolerance, chunk by chunk."""
        t = self.tol.gradient
        a, e = a.view(-1, self.vocab), e.view(-1, self.vocab)
        scales = row_scales(advantages, self.seq_next, self.params)
        step = rows_per_chunk(self.vocab)
        rows: list[int] = []
        for start in range(0, a.shape[0], step):
            ac, ec = a[start : start + step].to(torch.float64), e[start : start + step].to(torch.float64)
            allowed = 2 * (t.element_rtol * ec.abs() + t.element_atol_row_scale * scales[start : start + step, None]
                           + t.element_atol)
            bad = (~((ac - ec).abs() <= allowed)).any(dim=1)
            rows += [start + int(r) for r in bad.nonzero().flatten()]
        return rows

    def _last_row(self, Q: InputSlot, g_d: torch.Tensor, loss_d: float) -> None:
        logits = Q.tensors["logits"]
        original = logits[:, -1, :].clone()
        for i, kind in enumerate(self.spec.validation.poison.last_position):
            value = {"nan": float("nan"), "inf": float("inf"), "huge": torch.finfo(logits.dtype).max}[kind]
            logits[:, -1, :] = value
            Q.commit()
            label = f"G{i + 1}"
            g = self._call(label, Q, self.out1, ("last-row-ignored", "no-mutation", "no-aliasing"))
            if g is not None:
                rel = self._relation(g.grad, g_d, Q.pristine["advantages"])
                loss_ok = abs(g.loss - loss_d) <= self.tol.loss.allowed(loss_d)
                ok = rel.passed and loss_ok and rel.last_rows_nonzero == 0
                self.book.record("last-row-ignored", label, ok,
                                 f"logits[:, S, :] = {kind} changed no output" if ok else
                                 f"logits[:, S, :] = {kind} changed the outputs: loss {g.loss!r} vs {loss_d!r}; "
                                 + rel.describe(),
                                 {"poison": kind, "loss": json_float(g.loss), "loss_before": json_float(loss_d),
                                  "gradient": rel.evidence(), "last_row": rel.last_row_evidence()})
        logits[:, -1, :] = original
        Q.commit()

    def _adversarial(self, P: InputSlot) -> None:
        seed = self.seeds[-1] ^ 0xA5A5A5A5
        profiles = self.spec.validation.adversarial_profiles
        gen.generate(self.spec, self.rw, seed, self.device, profiles=profiles, out=P.tensors)
        P.commit()
        i = self._call("I", P, self.out1, ("adversarial-inputs", "finite", "no-mutation", "no-aliasing"))
        if i is None:
            return
        self._finite("I", i)
        loss_cmp, cmp = self._reference(i, P)
        ok = cmp.passed and loss_cmp.passed and cmp.nan == 0 and cmp.inf == 0
        self.book.record("adversarial-inputs", "I", ok,
                         f"profiles {', '.join(profiles)}: " + ("match the reference" if ok else cmp.describe()),
                         {"profiles": list(profiles), "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})
