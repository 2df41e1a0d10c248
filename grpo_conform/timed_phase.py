"""The timed protocols of a workload: right after its conformance (the GPU is this run's alone), or,
where slots share the GPU (gate/gpu_share.py), all of a slot's at the end, with the GPU to itself.

The same turn runs again, alone, every workload that ran out of GPU memory beside other slots
(`ran_out_of_memory`): a verdict never rests on memory that other slots held. An implementation that
fakes the message gains only a run alone, as a serial run would give it.

Deferred timing runs under the "exclusive" hold, when no other slot has a worker or queued work on the
GPU: after the slot has closed its conformance worker and given up its "present" hold, in a fresh worker;
or, for the last slot to finish conformance (the gate's `try`: no other slot holds anything), at once in
its conformance worker. It measures the bandwidth ceilings there too (they size every floor) and times
each deferred workload at the inputs its conformance ran (`resolved`: the same shapes, dtypes and axes the
workload's record names).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from grpo_conform.checks import internal
from grpo_conform.checks.registry import TIMING_CHECKS
from grpo_conform.checks.timed import WorkloadTiming, skipped_timing, timing_failure_outcomes
from grpo_conform.gate.plan import select_outcomes
from grpo_conform.isolation.session import ImplementationLoadError, WorkerFailure, WorkerSession
from grpo_conform.phases import PHASES
from grpo_conform.results import INTERNAL_ERROR, CheckOutcome, WorkloadResult


#: Where a workload's timed protocols ran, as each timing says (`timed_in`): inline, right after its
#: conformance in the same worker (one slot on the GPU); or in the slot's exclusive turn, a fresh worker
#: alone on the GPU once every slot's conformance is done (slots sharing a GPU).
INLINE = {"where": "inline", "worker": "the workload's conformance worker"}
EXCLUSIVE_TURN = {"where": "exclusive-turn", "worker": "a fresh worker, alone on the GPU"}
#: The turn of the last slot to finish conformance, in its conformance worker (check.py, gate `try`).
EXCLUSIVE_TURN_CONFORMANCE_WORKER = {"where": "exclusive-turn",
                                     "worker": "the slot's conformance worker, alone on the GPU"}


def time_workload(session: WorkerSession, spec, w, resolved, ctx, say, name: str, member: str,
                  draws: dict[str, Any], turn: dict[str, str] = INLINE):
    """(timings, timed outcomes) of one workload; none where timing does not apply (CPU, untimed workloads).
    Every timing says where it ran (`turn`: INLINE or EXCLUSIVE_TURN)."""
    if ctx.device.type != "cuda" or not w.timed:
        return [], []
    if ctx.timing is None:
        return [], skipped_timing("timing not requested (--no-timing)")
    if session is None or not session.alive:
        return [], skipped_timing("the worker was lost before timing")
    say(name, member, w.name, f"timing {', '.join(ctx.timing.protocols)}")
    timing = WorkloadTiming(session, spec, resolved, ctx.timing, ctx.floor_fn(spec, resolved),
                            ctx.gemm_ceiling_fn(spec, resolved))
    try:
        with PHASES("timing"), PHASES.inclusive("probes", "timing"):
            timings, outcomes = timing.run()
        return [{**t, "timed_in": dict(turn)} for t in timings], outcomes
    except WorkerFailure as failure:
        return [], timing_failure_outcomes(failure)
    finally:
        if timing.held:  # the timed sets' storages the worker still holds (worker.op_unbind)
            draws["held_after_unbind_timed"] = timing.held


def judged_timing(session, spec, w, resolved, ctx, say, name: str, member: str, draws: dict[str, Any],
                  turn: dict[str, str] = INLINE):
    """time_workload, with grpo-conform's own exceptions in the timed judging reported as not judged."""
    try:
        return time_workload(session, spec, w, resolved, ctx, say, name, member, draws, turn)
    except Exception as exc:  # the timed protocols' own judging (timed-outputs) raised: see check.run_workload
        if not internal.is_internal(exc):
            raise
        draws[INTERNAL_ERROR] = info = internal.describe(exc, "the timed protocols")
        return [], list(internal.outcomes(TIMING_CHECKS, info))


def release_cuda(device: torch.device) -> int:
    """Frees what this workload left in this process and returns the bytes still allocated. Buffers the
    worker opened through CUDA IPC wait in torch's limbo until it lets go; `ipc_collect` frees those it
    has. A count that grows from workload to workload is a leak: round30a on the H200 ran out of memory
    at the tenth member, 122 GiB allocated here (docs/timing.md)."""
    torch.cuda.ipc_collect()
    if torch.cuda.memory_allocated(device) > (256 << 20):
        gc.collect()  # cyclic garbage holding CUDA tensors is freed only by a full collection (~0.1 s: when needed)
        torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.memory_allocated(device))


@dataclass(frozen=True)
class Deferred:
    """A workload whose timing (or, `rerun`, whole run) waits for the slot's exclusive turn: where its
    result lies (`results[index]` of member plan `mp`) and what its conformance ran."""

    mp: Any  # gate.plan.MemberPlan
    results: list  # the member's WorkloadResults, patched in place
    index: int
    w: Any
    resolved: Any
    checks: tuple[str, ...]  # -k
    rerun: str = ""  # why it runs again alone (conformance and timing); "" = timing only


OUT_OF_MEMORY = ("out of memory", "outofmemoryerror")


def ran_out_of_memory(result: WorkloadResult) -> str:
    """The message of the first outcome that failed or was skipped for lack of GPU memory, or ""."""
    for o in result.outcomes:
        if o.status != "pass" and any(m in (o.message or "").lower() for m in OUT_OF_MEMORY):
            return f"{o.check}: {(o.message or '').splitlines()[0][:200]}"
    info = result.draws.get(INTERNAL_ERROR) or {}
    text = f"{info.get('type', '')} {info.get('message', '')}".lower()
    return f"internal error: {info.get('type')}" if any(m in text for m in OUT_OF_MEMORY) else ""


def run_deferred(impl, deferred: list[Deferred], ctx, request, say, start_worker: Callable, stop,
                 rerun: Callable, reuse=None) -> None:
    """Times every deferred workload with one worker (a new one after a loss) and puts the timings and
    timed outcomes into their results. `ctx` is the run's context with the ceilings measured under
    the exclusive hold; `start_worker(mp)` returns a started WorkerSession or raises; after `stop`
    (--deadline, --fail-fast) the rest is reported not timed, with its reason. A `rerun` entry runs
    whole again: `rerun(session, d)` returns its new WorkloadResult (check.run_workload, timed inline).
    A worker that does not start is not started again: a hang at load costs one timeout, as in one slot.
    `reuse`: the slot's conformance worker, which `start_worker` hands back while it lives; the turn never
    closes it (its owner, check.py, does)."""
    turn = _Turn(start_worker, reuse)
    try:
        for d in deferred:
            if d.rerun:
                why = stop.reason or turn.worker(d.mp)[1]
                if why:  # never the out-of-memory verdict of a run beside other slots
                    d.results[d.index] = _not_judged(d.results[d.index], d.rerun, why)
                    continue
                say(impl.name, d.mp.label, d.w.name, f"again, alone on the GPU ({d.rerun})")
                result = rerun(turn.session, d)
                d.results[d.index] = replace(result, draws={**result.draws, "rerun_alone": d.rerun})
                continue
            result: WorkloadResult = d.results[d.index]
            draws = dict(result.draws)
            timed: list = []
            timings: list = []
            if INTERNAL_ERROR in draws:  # conformance raised: nothing timed either
                timed = list(internal.outcomes(TIMING_CHECKS, draws[INTERNAL_ERROR]))
            elif stop.reason:
                timed = skipped_timing(f"{stop.reason} (its conformance ran; its timing waited for the GPU)")
            else:
                session, why = turn.worker(d.mp)
                if why:
                    timed = skipped_timing(f"not timed: {why}")
                else:
                    reused = reuse is not None and session is reuse
                    where = EXCLUSIVE_TURN_CONFORMANCE_WORKER if reused else EXCLUSIVE_TURN
                    timings, timed = judged_timing(session, d.mp.spec, d.w, d.resolved, ctx, say, impl.name,
                                                   d.mp.label, draws, where)
                if getattr(ctx.device, "type", None) == "cuda":
                    draws["cuda_allocated_after_timing"] = release_cuda(ctx.device)
            outcomes = result.outcomes + tuple(select_outcomes(tuple(timed), d.checks))
            d.results[d.index] = replace(result, outcomes=outcomes, timings=tuple(timings), draws=draws)
    finally:
        turn.close()


class _Turn:
    """The turn's worker: started when first needed, again after a loss, never after a failed start."""

    def __init__(self, start_worker: Callable, reuse: WorkerSession | None = None):
        self.start_worker = start_worker
        self.reuse = reuse  # not this turn's to close
        self.session: WorkerSession | None = None
        self.lost = ""  # why no worker could be started

    def worker(self, mp) -> tuple[WorkerSession | None, str]:
        if self.lost:
            return None, self.lost
        if self.session is None or not self.session.alive:
            self.close()
            try:
                self.session = self.start_worker(mp)
            except (ImplementationLoadError, WorkerFailure) as exc:
                self.lost = f"its worker did not start ({_first(str(exc))})"
                return None, self.lost
        return self.session, ""

    def close(self) -> None:
        if self.session is not None and self.session is not self.reuse:
            self.session.close()
        self.session = None


def _first(text: str) -> str:
    return text.splitlines()[0][:200] if text else text


def _not_judged(result: WorkloadResult, short: str, why: str) -> WorkloadResult:
    """A workload that ran out of memory beside other slots and could not run again alone: nothing of
    it is judged (its failures may be the other slots' doing)."""
    reason = f"not judged: out of GPU memory beside other slots ({short}); not run again alone: {why}"
    outcomes = tuple(CheckOutcome(o.check, "skipped", reason, {}) for o in result.outcomes)
    return replace(result, outcomes=outcomes, draws={**result.draws, "rerun_alone": short, "not_rerun": why})
