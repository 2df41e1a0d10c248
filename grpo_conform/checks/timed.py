"""Timed protocols of one workload on CUDA, driven from the parent, and the checks they feed:
timed-outputs, timing-floor, side-stream and caching.

For each protocol: warmup calls on fresh inputs (excluded), timed calls on fresh inputs (every
call gets new values written in place; buffer sets rotate so addresses change too), a few timed
calls re-checked against the reference (chosen at random after the inputs are written), then
calls on identical repeated inputs: if those run more than 10% faster than fresh ones, results
are being cached (MLPerf TEST04). Event time far below host wall time around a device-wide
synchronize means work was hidden on another stream. A median below the DRAM floor of its
protocol is impossible and fails.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpo_conform import inputs as gen
from grpo_conform.checks.buffers import InputSlot, OutputSlot
from grpo_conform.compare import GradientComparator, compare_loss, json_float
from grpo_conform.floors import Floor, below_floor
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.reference import GrpoParameters, reference_gradient, reference_loss
from grpo_conform.results import CheckOutcome
from grpo_conform.spec import ResolvedWorkload, Spec
from grpo_conform.timing import METHOD, Distribution, flush_bytes_for

CACHING_RATIO = 0.9
SIDE_STREAM_RATIO = 0.5
SIDE_STREAM_MIN_GAP_NS = 100_000

#: protocol -> its floors on this GPU (grpo_conform.floors.compute_floor).
FloorFn = Callable[[str], Floor]


@dataclass(frozen=True)
class TimingSettings:
    protocols: tuple[str, ...] = ("forward", "full")
    warmup: int = 3
    reps: int = 20
    identical_reps: int = 10
    rechecks: int = 3
    buffer_sets: int = 2


class WorkloadTiming:
    def __init__(self, session: WorkerSession, spec: Spec, resolved: ResolvedWorkload,
                 settings: TimingSettings, floor_of: FloorFn):
        self.session, self.spec, self.rw, self.settings, self.floor_of = session, spec, resolved, settings, floor_of
        self.params = GrpoParameters.from_mapping(spec.parameter_values)
        self.tol = spec.tolerance(resolved.dtypes.get("logits", spec.input("logits").dtypes[0]))
        self.rng = random.Random(secrets.randbits(64))
        self.device = session.device

    def run(self) -> tuple[list[dict[str, Any]], list[CheckOutcome]]:
        rw = self.rw
        dtypes = {t.name: gen.torch_dtype(rw.dtypes.get(t.name, t.dtypes[0])) for t in self.spec.inputs}
        self.sets = [InputSlot.create(self.session, f"T{j}", rw.shapes, dtypes) for j in range(self.settings.buffer_sets)]
        self.out = OutputSlot.create(self.session, "TO", rw.shapes["logits"], dtypes["logits"])
        self.session.request(op="time_setup", flush_bytes=flush_bytes_for(self.device))
        timings, findings = [], {name: [] for name in ("timed-outputs", "timing-floor", "side-stream", "caching")}
        for protocol in self.settings.protocols:
            result = self._protocol(protocol)
            timings.append(result)
            for name, finding in result.pop("_findings").items():
                findings[name].append(finding)
        for j in range(self.settings.buffer_sets):
            self.session.request(op="unbind", slot=f"T{j}")
        self.session.request(op="time_setup", flush_bytes=0)
        return timings, [_outcome(name, found) for name, found in findings.items()]

    # -- one protocol -----------------------------------------------------------------------
    def _fresh(self, j: int) -> InputSlot:
        slot = self.sets[j]
        gen.generate(self.spec, self.rw, gen.fresh_seed(), self.device, out=slot.tensors)
        slot.commit()
        torch.cuda.synchronize(self.device)
        return slot

    def _timed_call(self, slot: InputSlot, protocol: str, recheck: bool) -> dict[str, Any]:
        if recheck:
            self.out.clear()
        wall0 = time.perf_counter_ns()
        reply = self.session.request(op="time", inputs=slot.name, protocol=protocol,
                                     outputs=self.out.name if recheck else None)
        reply["parent_ns"] = time.perf_counter_ns() - wall0
        return reply

    def _protocol(self, protocol: str) -> dict[str, Any]:
        s = self.settings
        for i in range(s.warmup):
            self._timed_call(self._fresh(i % s.buffer_sets), protocol, recheck=False)
        recheck_at = set(self.rng.sample(range(s.reps), min(s.rechecks, s.reps)))
        event, host, parent, peaks, rechecks = [], [], [], [], []
        for i in range(s.reps):
            slot = self._fresh(i % s.buffer_sets)
            reply = self._timed_call(slot, protocol, recheck=i in recheck_at)
            event.append(reply["event_ns"])
            host.append(reply["wall_ns"])
            parent.append(reply["parent_ns"])
            peaks.append(reply["peak_bytes"])
            if i in recheck_at:
                rechecks.append(self._recheck(i, slot, protocol))
        same = self._fresh(0)
        identical = [self._timed_call(same, protocol, recheck=False)["event_ns"] for _ in range(s.identical_reps)]
        fresh_d, ident_d = Distribution.of(event), Distribution.of(identical)
        host_d, parent_d = Distribution.of(host), Distribution.of(parent)
        floor = self.floor_of(protocol)
        io_bytes = self.rw.numel("logits") * self.sets[0].tensors["logits"].element_size()
        result: dict[str, Any] = {
            "protocol": protocol,
            "method": METHOD,
            "warmup": s.warmup,
            "event": fresh_d.to_json(),
            "identical_inputs": ident_d.to_json(),
            "host_wall": host_d.to_json(),
            "parent_wall": parent_d.to_json(),
            "peak_bytes": max(peaks),
            "peak_over_logits": json_float(max(peaks) / io_bytes),
            "rechecks": rechecks,
            "floor": floor.to_json(),
            "warnings": [],
        }
        if protocol == "backward":
            result["warnings"].append("backward-only timing: meaningless when work moves into forward; never "
                                      "compare it across implementations (the headline is 'full')")
        median = fresh_d.median_ns
        if floor.dram_ns:
            result["floor_ratio"] = json_float(median / floor.dram_ns)
        if floor.measured_ns:
            result["measured_floor_ratio"] = json_float(median / floor.measured_ns)
        result["below_floor"] = below_floor(median, floor)
        result["summary"] = _summary(result)
        result["_findings"] = self._findings(result, fresh_d, ident_d, host_d, parent_d, floor, rechecks)
        return result

    def _recheck(self, i: int, slot: InputSlot, protocol: str) -> dict[str, Any]:
        x = slot.pristine
        ref = reference_loss(x["logits"], x["completion_ids"], x["advantages"], self.params)
        loss_cmp = compare_loss(float(self.out.loss[0]), ref, self.tol.loss)
        entry: dict[str, Any] = {"iteration": i, "loss": loss_cmp.to_json()}
        ok = loss_cmp.passed
        if protocol != "forward":
            cmp = GradientComparator(self.tol.gradient, self.rw.axes["seq_next"], self.rw.shapes["logits"][-1])
            flat = self.out.grad.view(-1, cmp.vocab)
            for chunk in reference_gradient(x["logits"], x["completion_ids"], x["advantages"], self.params):
                cmp.update(chunk.start, flat[chunk.start : chunk.stop], chunk.values, chunk.scale)
            ok = ok and cmp.passed and cmp.last_rows_nonzero == 0
            entry["gradient"] = {"passed": cmp.passed, "frobenius_rel": json_float(cmp.frobenius_rel),
                                 "mismatches": cmp.mismatches, "nan": cmp.nan}
        entry["passed"] = ok
        return entry

    def _findings(self, result, fresh_d, ident_d, host_d, parent_d, floor, rechecks) -> dict[str, tuple]:
        p = result["protocol"]
        med = fresh_d.median_ns
        bad = [r for r in rechecks if not r["passed"]]
        out: dict[str, tuple] = {
            "timed-outputs": (not bad, f"{p}: {len(rechecks) - len(bad)}/{len(rechecks)} re-checked timed outputs "
                              f"match the reference", {"protocol": p, "rechecks": rechecks}),
        }
        if floor.meaningful and floor.strict_ns:
            below = below_floor(med, floor)
            out["timing-floor"] = (not below, f"{p}: median {med / 1e6:.4f} ms is "
                                   f"{'BELOW' if below else 'above'} the DRAM floor {floor.strict_ns / 1e6:.4f} ms"
                                   + (": impossible, not published" if below else ""),
                                   {"protocol": p, "median_ns": med, "strict_floor_ns": floor.strict_ns,
                                    "dram_floor_ns": floor.dram_ns})
        gap = host_d.median_ns - med
        hidden = med < SIDE_STREAM_RATIO * host_d.median_ns and gap > SIDE_STREAM_MIN_GAP_NS
        forged = med > parent_d.median_ns
        out["side-stream"] = (not (hidden or forged),
                              f"{p}: event {med / 1e6:.4f} ms vs host wall {host_d.median_ns / 1e6:.4f} ms around a "
                              "device-wide synchronize" + ("; work hidden from the current stream" if hidden else "")
                              + ("; event time exceeds the parent's own wall clock" if forged else ""),
                              {"protocol": p, "event_median_ns": med, "host_wall_median_ns": host_d.median_ns,
                               "parent_wall_median_ns": parent_d.median_ns})
        ratio = ident_d.median_ns / med if med else 1.0
        cached = ratio < CACHING_RATIO
        out["caching"] = (not cached, f"{p}: identical repeated inputs take {ratio:.3f}x the time of fresh ones"
                          + (" (results are cached)" if cached else ""),
                          {"protocol": p, "identical_median_ns": ident_d.median_ns, "fresh_median_ns": med,
                           "ratio": json_float(ratio), "threshold": CACHING_RATIO})
        return out


def _outcome(name: str, found: list[tuple]) -> CheckOutcome:
    if not found:
        return CheckOutcome(name, "skipped", "no protocol with a floor was timed", {})
    bad = [f for f in found if not f[0]]
    first = bad[0] if bad else found[0]
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
    text += f"; peak {result['peak_over_logits']:.2f}x logits"
    return text


def timing_failure_outcomes(failure: WorkerFailure) -> list[CheckOutcome]:
    status = "timeout" if failure.kind == "timeout" else "error"
    return [CheckOutcome(n, status, f"timed calls did not complete: {failure}", failure.evidence())
            for n in ("timed-outputs", "timing-floor", "side-stream", "caching")]


def skipped_timing(reason: str) -> list[CheckOutcome]:
    return [CheckOutcome(n, "skipped", reason, {}) for n in ("timed-outputs", "timing-floor", "side-stream", "caching")]
