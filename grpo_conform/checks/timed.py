"""Timed protocols of one workload on CUDA, driven from the parent, and the checks they feed:
timed-outputs, timing-floor, side-stream and caching.

For each protocol, in passes: the parent writes new values in place into every one of K buffer
sets (so both values and addresses change from call to call), then the worker runs one call per
set back to back, in a random order, after an untimed call on a warm set (so the GPU is busy
again after the parent's work: timing single calls between the parent's rewrites measured idle
clocks, not the kernel). One call of some passes, chosen at random, has its outputs copied out
and re-checked against the reference. Then identical inputs, call by call, on one of the timed sets chosen at
random (its last values rewritten in place, a call on another buffer first, exactly as for fresh calls): if
those run more than 10% faster than the fresh calls on that same set (its mask, so its work, stays over a
protocol; only its values change) with the two distributions apart (the identical calls' 75th percentile below the fresh
calls' 25th: noise of short calls is not a cache), results are being cached (MLPerf TEST04). Event time far below
host wall time around a device-wide synchronize means work was hidden on another stream. A
median below the DRAM floor of its protocol is impossible and fails.
"""

from __future__ import annotations

import random
import secrets
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from grpo_conform import device_memory, gemm_ceiling
from grpo_conform.checks.buffers import InputSlot, OutputSlot, input_dtypes, only_gradient
from grpo_conform.compare import compare_loss, json_float
from grpo_conform.dtypes import torch_dtype
from grpo_conform.floors import Floor, below_floor
from grpo_conform.ops import operation_for
from grpo_conform.ops.interface import fresh_seed
from grpo_conform.phases import PHASES
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.checks.units import judge_units
from grpo_conform.results import CheckOutcome
from grpo_conform.spec import ResolvedWorkload, Spec
from grpo_conform.timing import METHOD, Distribution, flush_bytes_for

CACHING_RATIO = 0.9
SIDE_STREAM_RATIO = 0.5
SIDE_STREAM_MIN_GAP_NS = 100_000

#: (protocol[, unmasked]) -> its floors on this GPU (grpo_conform.floors.compute_floor, traffic-v1).
FloorFn = Callable[..., Floor]
#: (protocol, the timed inputs' pristine values) -> the GEMM ceiling of its unavoidable GEMMs on those values
#: (grpo_conform.gemm_ceiling.measure), or None.
CeilingFn = Callable[[str, Optional[dict]], Optional[dict]]


@dataclass(frozen=True)
class TimingSettings:
    # full-scaled: forward + (c * loss).backward() with the spec's timing.upstream_scale (0.25),
    # what gradient accumulation and loss scaling do: part of the headline beside c = 1.
    protocols: tuple[str, ...] = ("forward", "full", "full-scaled")
    warmup: int = 1  # warmup passes (every buffer set once), excluded
    reps: int = 20  # timed calls on fresh inputs: passes x buffer sets
    identical_reps: int = 10
    rechecks: int = 3  # passes with one call re-checked against the reference
    buffer_sets: int = 4  # fewer when the device's free memory is short


class WorkloadTiming:
    def __init__(self, session: WorkerSession, spec: Spec, resolved: ResolvedWorkload,
                 settings: TimingSettings, floor_of: FloorFn, ceiling_of: CeilingFn | None = None):
        self.session, self.spec, self.rw, self.settings, self.floor_of = session, spec, resolved, settings, floor_of
        self.ceiling_of = ceiling_of
        first = spec.differentiable_input  # the first differentiable input sets the tolerance's dtype
        self.grad_dtype = resolved.dtypes.get(first.name, first.dtypes[0])
        self.tol = spec.tolerance(self.grad_dtype)
        self.rng = random.Random(secrets.randbits(64))
        self.op = operation_for(spec)
        self.device = session.device
        self.held: list[str] = []  # the timed sets' storages the worker still held once unbound (worker.op_unbind)

    def _count_mask(self, slot: InputSlot) -> None:
        counted = self.op.work_counts(slot.tensors)  # the operation's counts of the values (a mask's rows)
        if counted is not None:
            self.set_masks[slot.name] = counted
            if self.mask_low is None or counted.unmasked < self.mask_low.unmasked:
                self.mask_low = counted

    def run(self) -> tuple[list[dict[str, Any]], list[CheckOutcome]]:
        rw = self.rw
        self.mask_low = None
        self.set_masks: dict[str, Any] = {}  # each buffer set's mask count as last written (masked members)
        dtypes = input_dtypes(self.spec, rw)
        set_bytes = 2 * device_memory.set_and_gradient_bytes(self.spec, rw)[0]  # a set and its pristine copy
        free, _ = torch.cuda.mem_get_info(self.device)
        k = max(2, min(self.settings.buffer_sets, int(0.3 * free // max(1, set_bytes)) - 1))
        self.sets = [InputSlot.create(self.session, f"T{j}", rw.shapes, dtypes) for j in range(k)]
        self.warm = InputSlot.create(self.session, "TW", rw.shapes, dtypes)
        self.out = OutputSlot.for_spec(self.session, "TO", self.spec, rw.shapes, dtypes)
        # The timed calls run at this member's declared values (the worker may have served another member)
        self.session.request(op="time_setup", flush_bytes=flush_bytes_for(self.device),
                             params=dict(self.spec.parameter_values))
        timings, findings = [], {name: [] for name in ("timed-outputs", "timing-floor", "side-stream", "caching")}
        self._filled: set[str] = set()  # slots fully generated (in a protocol, or in this run: `_refresh`)
        try:
            for protocol in self.settings.protocols:
                result = self._protocol(protocol)
                timings.append(result)
                for name, finding in result.pop("_findings").items():
                    findings[name].append(finding)
        finally:
            if self.session.alive:  # one unbind: the worker collects its garbage once (worker.op_unbind)
                self.held = self.session.request(op="unbind", slots=[*(s.name for s in self.sets), self.warm.name,
                                                                     "TO"]).get("held") or []
                self.session.request(op="time_setup", flush_bytes=0)
        return timings, [_outcome(name, found) for name, found in findings.items()]

    # -- one protocol -----------------------------------------------------------------------
    def _refresh(self, slots: list[InputSlot], full: bool = False) -> None:
        """New values in every slot, same addresses: a full generation from a fresh OS seed the first
        time a slot is filled in a protocol (or `full`), else the operation's cheap in-place refresh
        where it has one (grpo-logits: every row rotated along the vocabulary with its target,
        `inputs.refresh_in_place`; the mask and its count stay). ~25 refreshes a protocol, 75 a
        timed workload: 15 full generations of them (docs/timing.md, "Timed refreshes"). An operation
        whose `refresh_spans_protocols` is true (grpo-fused-linear: its operation.py says why that is
        safe) keeps a slot's full draw across the protocols: 5 full generations a timed workload."""
        refresh = getattr(self.op, "refresh", None)
        with PHASES("inputs"):
            for slot in slots:
                if full or refresh is None or slot.name not in self._filled:
                    self.op.generate(self.spec, self.rw, fresh_seed(), self.device, out=slot.tensors)
                    self._filled.add(slot.name)
                    self._count_mask(slot)
                    PHASES.tally("inputs-generated")  # (`inputs` counts the refreshes, of up to 4 sets each)
                else:
                    refresh(slot.tensors, self.rng)
                    PHASES.tally("inputs-refreshed")
                slot.commit()
            torch.cuda.synchronize(self.device)

    def _batch(self, names: list[str], protocol: str, copy_from: str | None = None,
               warm: str | None = None) -> tuple[list[dict], int]:
        self.out.clear()
        wall0 = time.perf_counter_ns()
        reply = self.session.request(op="time", sets=names, protocol=protocol, warm=warm or self.warm.name,
                                     copy_from=copy_from, outputs=self.out.name if copy_from else None,
                                     gradients=[g.input for g in self.spec.gradients],
                                     upstream=self.upstream_for(protocol))
        return reply["results"], time.perf_counter_ns() - wall0

    def _identical(self, protocol: str) -> tuple[list[dict], str]:
        """The same values again and again, under the conditions of a fresh call: one timed set, chosen at
        random, rewritten in place with its last values by the parent (same addresses, same bytes) and
        preceded by a call on another set, so only a cache of results (by address or content) can make these
        calls faster than that set's fresh calls. (The calls and the set's name.)

        The same set, not a set of its own: masked members' sets keep their mask over a protocol, so a
        set's fresh calls do exactly the identical calls' work. A separate set with its own mask had its
        times moved along a slope fitted over the four timed masks; on an H100 (round35c, thirty-first
        session) their narrow spread (5875-6163 of 8192 rows) let that slope predict 1.93 ms for the separate
        set's work where it took 1.68 ms, and an honest kernel failed at 0.870x."""
        again = self.rng.choice(self.sets)
        before = self.rng.choice([s for s in self.sets if s is not again])
        out = []
        for _ in range(self.settings.identical_reps):
            again.restore()
            torch.cuda.synchronize(self.device)
            results, _ = self._batch([again.name], protocol, warm=before.name)
            out += results
        return out, again.name

    def _protocol(self, protocol: str) -> dict[str, Any]:
        s = self.settings
        if not self.op.refresh_spans_protocols:
            self._filled = set()  # slots fully generated in this protocol
        self._refresh([self.warm])
        names = [slot.name for slot in self.sets]
        for _ in range(s.warmup):
            self._refresh(self.sets)
            self._batch(names, protocol)
        passes = max(1, -(-s.reps // len(self.sets)))
        recheck_passes = set(self.rng.sample(range(passes), min(s.rechecks, passes)))
        calls, rechecks, batch_walls = [], [], []
        for i in range(passes):
            self._refresh(self.sets)
            order = self.rng.sample(names, len(names))
            target = self.rng.choice(order) if i in recheck_passes else None
            results, wall = self._batch(order, protocol, target)
            for name, r in zip(order, results):  # the worker answers in the order of `sets`
                r["mask"], r["set"] = self.set_masks.get(name), name
            calls += results
            batch_walls.append((wall, sum(r["event_ns"] for r in results)))
            if target is not None:
                with PHASES("judge"):
                    rechecks.append(self._recheck(i, self.sets[names.index(target)], protocol))
        identical, again = self._identical(protocol)
        fresh_d = Distribution.of([c["event_ns"] for c in calls])
        ident_d = Distribution.of([c["event_ns"] for c in identical])
        same_d = Distribution.of([c["event_ns"] for c in calls if c["set"] == again])  # that set's fresh calls
        host_d = Distribution.of([c["wall_ns"] for c in calls])
        # traffic-v1 counts unmasked rows from the actual masks: the fewest of any timed set bounds every call
        floor = self.floor_of(protocol, self.mask_low) if self.mask_low is not None else self.floor_of(protocol)
        size = self.op.workload_size(self.spec, self.rw)
        io_bytes = size.elements * self.sets[0].tensors[size.tensor].element_size()
        peak = max(c["peak_bytes"] for c in calls)
        result: dict[str, Any] = {
            "protocol": protocol,
            "method": METHOD,
            "warmup_passes": s.warmup,
            "buffer_sets": len(self.sets),
            "event": fresh_d.to_json(),
            "event_samples_ns": [c["event_ns"] for c in calls],
            "identical_inputs": ident_d.to_json(),
            "identical_samples_ns": [c["event_ns"] for c in identical],
            "host_wall": host_d.to_json(),
            "pre_work": Distribution.of([c["pre_ns"] for c in calls]).to_json(),
            "parent_batches": [{"wall_ns": w, "event_sum_ns": e} for w, e in batch_walls],
            "peak_bytes": peak,
            "peak_over_logits": json_float(peak / io_bytes),
            "rechecks": rechecks,
            "floor": floor.to_json(),
            "warnings": [],
        }
        if protocol == "backward":
            result["warnings"].append("backward-only timing: meaningless when work moves into forward; never "
                                      "compare it across implementations (the headline is 'full')")
        median = fresh_d.median_ns
        per_call = self._per_call_floors(protocol, calls)
        if per_call is not None:
            result["floor_per_call"] = per_call
        for key, field in (("floor_ratio", "dram_ns"), ("measured_floor_ratio", "measured_ns")):
            if per_call is not None and per_call.get(key) is not None:
                result[key] = per_call[key]
            elif getattr(floor, field):
                result[key] = json_float(median / getattr(floor, field))
        result["below_floor"] = below_floor(median, floor) or bool(per_call and per_call["below_floor"])
        if self.ceiling_of is not None:  # after the implementation's calls: no worker call in flight
            with PHASES("timing"):
                # on the first buffer set's values, from the parent's pristine copy (no worker maps it)
                gemm_ceiling.attach(result, self.ceiling_of(protocol, self.sets[0].pristine))
        result["summary"] = _summary(result)
        result["_findings"] = self._findings(result, fresh_d, ident_d, host_d, batch_walls, floor, rechecks,
                                             (again, same_d))
        return result

    def _mask_floor(self, protocol: str, mask) -> Floor:
        """The floor of one mask's work, computed once per (protocol, unmasked rows) for the per-call ratios."""
        cache = self.__dict__.setdefault("_floors", {})
        key = (protocol, mask.unmasked)
        if key not in cache:
            cache[key] = self.floor_of(protocol, mask)
        return cache[key]

    def _per_call_floors(self, protocol: str, calls: list[dict]) -> dict[str, Any] | None:
        """Masked members: every pass draws new masks, so calls move different amounts of data. The
        headline ratios are the median over calls of each call's time over the floor of its own
        inputs; `floor` (the fewest unmasked rows of any set) stays the bound no median may beat.
        (Dividing the median time by that lowest floor overstated masked ratios by ~10% on the H200,
        2026-12-02: 1.26x through the validator for what measured 1.16-1.19x call by call.)"""
        masks = [c.pop("mask", None) for c in calls]
        if not calls or any(m is None for m in masks):
            return None
        floors = {m.unmasked: self._mask_floor(protocol, m) for m in masks}
        out: dict[str, Any] = {
            "method": "median over timed calls of (call time / floor of that call's own inputs, traffic-v1)",
            "calls": len(calls),
            "unmasked_rows": {"min": min(m.unmasked for m in masks), "max": max(m.unmasked for m in masks),
                              "median": statistics.median(m.unmasked for m in masks),
                              "scored": masks[0].scored},
        }

        def median_ratio(field: str) -> float | None:
            ratios = [c["event_ns"] / getattr(floors[m.unmasked], field) for c, m in zip(calls, masks)
                      if getattr(floors[m.unmasked], field)]
            return statistics.median(ratios) if ratios else None  # the same median as Distribution

        for key, field in (("floor_ratio", "dram_ns"), ("measured_floor_ratio", "measured_ns")):
            ratio = median_ratio(field)
            if ratio is not None:
                out[key] = json_float(ratio)
        strict = median_ratio("strict_ns")
        out["below_floor"] = strict is not None and strict < 1.0
        return out

    def _recheck(self, i: int, slot: InputSlot, protocol: str) -> dict[str, Any]:
        x = slot.pristine
        model = ReferenceModel.defaults(self.spec)  # timed calls run at the declared defaults
        error_model = self.op.error_model(self.spec, x, model.params, self.grad_dtype)
        if error_model is not None:  # an operation with its own error model: every gradient by name
            return self._recheck_units({"iteration": i}, x, model, protocol, error_model)
        actual, expected = float(self.out.loss[0]), model.loss(x)
        loss_cmp = compare_loss(actual, expected, self.tol.loss)
        if not loss_cmp.passed:  # conformance's fp32 allowance, derived only where it can change the verdict
            with PHASES("reference"):
                floor = self.op.recheck_loss_floor(self.spec, self.rw, x, model)
            loss_cmp = compare_loss(actual, expected, self.tol.loss, floor)
        entry: dict[str, Any] = {"iteration": i, "loss": loss_cmp.to_json()}
        ok = loss_cmp.passed
        if protocol != "forward":
            c = self.upstream_for(protocol)
            # No error model: the operation's one gradient, re-checked row by row by the operation (grpo-logits).
            name = only_gradient(self.spec)
            cmp = self.op.recheck_gradient(self.spec, self.rw, self.tol, self.out.grads[name], x, model, c)
            ok = ok and cmp.passed and cmp.last_rows_nonzero == 0
            entry["gradient"] = {"passed": cmp.passed, "frobenius_rel": json_float(cmp.frobenius_rel),
                                 "mismatches": cmp.mismatches, "nan": cmp.nan, "upstream": c}
        entry["passed"] = ok
        return entry

    def _recheck_units(self, entry: dict[str, Any], x, model: ReferenceModel, protocol: str, error_model) -> dict[str, Any]:
        ref_loss = model.loss(x)
        loss_cmp = compare_loss(float(self.out.loss[0]), ref_loss, self.tol.loss, error_model.loss)
        entry["loss"] = loss_cmp.to_json()
        ok = loss_cmp.passed
        if protocol != "forward":
            c = self.upstream_for(protocol)
            info = torch.finfo(torch_dtype(self.grad_dtype))
            _, cmps = judge_units(self.op, self.spec, self.rw, self.tol, model.params, x, float(self.out.loss[0]),
                                  self.out.grads, c, error_model, self.op.gradient_groupings(self.spec),
                                  2.0 * info.tiny * info.eps, ref_loss)
            ok = ok and cmps.passed
            # a failing gradient shows its evidence in full (worst elements, allowances), a passing one its summary
            entry["gradient"] = {"passed": cmps.passed, "upstream": c, "by_name": {
                n: g.evidence() if not g.passed else
                {"frobenius_rel": json_float(g.frobenius_rel), "mismatches": g.mismatches, "nan": g.nan}
                for n, g in cmps.by_name.items()}}
        entry["passed"] = ok
        return entry

    def upstream_for(self, protocol: str) -> float:
        return float(self.spec.timing.upstream_scale) if protocol == "full-scaled" else 1.0

    def _findings(self, result, fresh_d, ident_d, host_d, batch_walls, floor, rechecks,
                  same: tuple[str, Distribution]) -> dict[str, tuple]:
        """Each check's (passed, message, evidence). `same`: the set the identical calls ran on, and the
        distribution of its fresh calls (what `caching` compares them with)."""
        p = result["protocol"]
        med = fresh_d.median_ns
        bad = [r for r in rechecks if not r["passed"]]
        out: dict[str, tuple] = {
            "timed-outputs": (not bad, f"{p}: {len(rechecks) - len(bad)}/{len(rechecks)} re-checked timed outputs "
                              f"match the reference", {"protocol": p, "rechecks": rechecks}),
        }
        if floor.meaningful and floor.strict_ns:
            below = result["below_floor"]
            out["timing-floor"] = (not below, f"{p}: median {med / 1e6:.4f} ms is "
                                   f"{'BELOW' if below else 'above'} the strict floor {floor.strict_ns / 1e6:.4f} ms"
                                   + (": impossible, not published" if below else ""),
                                   {"protocol": p, "median_ns": med, "strict_floor_ns": floor.strict_ns,
                                    "dram_floor_ns": floor.dram_ns})
        gap = host_d.median_ns - med
        hidden = med < SIDE_STREAM_RATIO * host_d.median_ns and gap > SIDE_STREAM_MIN_GAP_NS
        # The worker reports event times; the parent's own clock around each batch bounds their sum.
        forged = any(events > wall for wall, events in batch_walls)
        out["side-stream"] = (not (hidden or forged),
                              f"{p}: event {med / 1e6:.4f} ms vs host wall {host_d.median_ns / 1e6:.4f} ms around a "
                              "device-wide synchronize" + ("; work hidden from the current stream" if hidden else "")
                              + ("; reported event times exceed the parent's own wall clock" if forged else ""),
                              {"protocol": p, "event_median_ns": med, "host_wall_median_ns": host_d.median_ns,
                               "batches_over_parent_clock": sum(1 for w, e in batch_walls if e > w)})
        again, same_d = same
        ratio = ident_d.median_ns / same_d.median_ns if same_d.median_ns else 1.0
        # Faster by more than 10% and clearly separated (noise of short calls is not a cache).
        cached = ratio < CACHING_RATIO and ident_d.quantile(0.75) < same_d.quantile(0.25)
        out["caching"] = (not cached, f"{p}: identical repeated inputs take {ratio:.3f}x the time of fresh ones "
                          f"on the same buffer set" + (" (results are cached)" if cached else ""),
                          {"protocol": p, "set": again, "identical_median_ns": ident_d.median_ns,
                           "fresh_median_ns": same_d.median_ns, "fresh_calls": len(same_d.samples_ns),
                           "fresh_median_ns_all_sets": med, "ratio": json_float(ratio), "threshold": CACHING_RATIO})
        return out


def _outcome(name: str, found: list[tuple]) -> CheckOutcome:
    if not found:
        return CheckOutcome(name, "skipped", "no protocol with a floor was timed", {})
    bad = [f for f in found if not f[0]]
    evidence = {"protocols": [f[2] for f in found]}
    message = "; ".join(f[1] for f in (bad or found))
    return CheckOutcome(name, "fail" if bad else "pass", message, evidence)


def _summary(result: dict[str, Any]) -> str:
    e = result["event"]
    text = (f"median {e['median_ns'] / 1e6:.4f} ms (p10 {e['p10_ns'] / 1e6:.4f}, p90 {e['p90_ns'] / 1e6:.4f}, "
            f"{e['reps']} reps)")
    if result.get("floor_ratio") is not None:
        text += f"; {result['floor_ratio']:.2f}x datasheet floor"
    if result.get("measured_floor_ratio") is not None:
        text += f", {result['measured_floor_ratio']:.2f}x measured floor"
    if result.get("gemm_ceiling_ratio") is not None:
        text += f", {result['gemm_ceiling_ratio']:.2f}x GEMM ceiling"
    text += f"; peak {result['peak_over_logits']:.2f}x logits"
    return text


def timing_failure_outcomes(failure: WorkerFailure) -> list[CheckOutcome]:
    status = "timeout" if failure.kind == "timeout" else "error"
    return [CheckOutcome(n, status, f"timed calls did not complete: {failure}", failure.evidence())
            for n in ("timed-outputs", "timing-floor", "side-stream", "caching")]


def skipped_timing(reason: str) -> list[CheckOutcome]:
    return [CheckOutcome(n, "skipped", reason, {}) for n in ("timed-outputs", "timing-floor", "side-stream", "caching")]
