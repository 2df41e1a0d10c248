"""Where a check run's wall time goes, by phase (docs/timing.md, "Validator time").

Always on and cheap (two perf_counter calls a phase): `check --format json` carries the totals under
`phases`, and `check --profile-phases` prints them. Phases nest; each second is counted once, in the
innermost phase open at the time (`exclusive`), so the phases and `other` add up to the run's wall
time. Probes are counted apart, inclusive (`probes`: every second spent inside that probe, its
round trips and judging included), as are workloads, and each probe within each workload
(`probe_workloads`, "probe @ workload": where a workload's seconds went, e.g. a member's first workload).

Parent-side GPU work is asynchronous: its time lands in the phase that waits for it, the judging's
`float()` reads in `judge`, the synchronize before each message in `worker`.

Phase names: `worker-start` (a worker process started and the implementation imported), `worker`
(a request to the worker and its reply: the implementation's calls, the harness around them, the
IPC), `inputs` (input sets generated, written and their pristine copies made), `judge` (the float64
reference and the comparison with it), `input-checks` (inputs compared with their pristine copies,
fingerprints of kept outputs), `timing` (the timed protocols' parent side), `scan` (the static source
scan), `compile-share` (slots sharing a GPU: a worker's compiled kernels to its store and
the store's to it, isolation/live_share.py), `compile-ahead` (on a first run unless GRPO_CONFORM_COMPILE_AHEAD=0: the next
member's proxy inputs drawn and sent to the slot's second worker, check_ahead.py). Anything else the parent
does is `other`.

Two opt-in environment switches, for finding where a phase's time goes (the second changes the run:
`check` writes no record under it, provenance.check_environment; nor under the worker's
GRPO_CONFORM_WORKER_PROFILE):
- `GRPO_CONFORM_PHASE_OPS=1`: the worker phase is split by the request's op (`worker:forward`,
  `worker:bind`, ...);
- `GRPO_CONFORM_PHASE_SYNC=1`: on CUDA, the parent waits for its queued GPU work at every phase
  boundary, so that work is counted in the phase that queued it instead of the next phase that reads
  a value (the host-side waits then show where they come from; the run is slower).
`GRPO_CONFORM_SAMPLE=DIR` (sampler.py) goes one level down: which functions each phase's time is spent
in, from a stack sampler in every process that runs the check (each slot too).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator


class PhaseClock:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.split_ops = os.environ.get("GRPO_CONFORM_PHASE_OPS") == "1"
        self._sync = _device_sync() if os.environ.get("GRPO_CONFORM_PHASE_SYNC") == "1" else None
        self.exclusive: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.probes: dict[str, float] = {}
        self.workloads: dict[str, float] = {}
        self.probe_workloads: dict[str, float] = {}
        self._workload: str | None = None  # the workload whose inclusive clock is open
        self._stack: list[list[Any]] = []  # [name, time the innermost phase last resumed]
        self._started = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        if self._stack:  # pause the enclosing phase
            outer = self._stack[-1]
            self.exclusive[outer[0]] = self.exclusive.get(outer[0], 0.0) + now - outer[1]
        self._stack.append([name, now])
        self.counts[name] = self.counts.get(name, 0) + 1
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            end = time.perf_counter()
            inner = self._stack.pop()
            self.exclusive[name] = self.exclusive.get(name, 0.0) + end - inner[1]
            if self._stack:
                self._stack[-1][1] = end  # the enclosing phase resumes

    def current(self) -> str | None:
        """The innermost open phase, or None (read by sampler.py from another thread: one read of the list)."""
        stack = self._stack
        try:
            return stack[-1][0]
        except IndexError:
            return None

    def worker_phase(self, op: str) -> str:
        """The phase a worker request counts in: `worker`, or `worker:<op>` under GRPO_CONFORM_PHASE_OPS."""
        return f"worker:{op}" if self.split_ops else "worker"

    def tally(self, name: str) -> None:
        """Count an event that takes no time of its own (a reused reference, a reused judgment)."""
        self.counts[name] = self.counts.get(name, 0) + 1

    @contextmanager
    def inclusive(self, table: str, key: str) -> Iterator[None]:
        start = time.perf_counter()
        outer = self._workload
        if table == "workloads":
            self._workload = key
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            totals = getattr(self, table)
            totals[key] = totals.get(key, 0.0) + spent
            if table == "workloads":
                self._workload = outer
            elif table == "probes" and self._workload is not None:
                both = f"{key} @ {self._workload}"
                self.probe_workloads[both] = self.probe_workloads.get(both, 0.0) + spent

    def to_json(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._started
        exclusive = {k: round(v, 3) for k, v in sorted(self.exclusive.items(), key=lambda kv: -kv[1])}
        exclusive["other"] = round(max(0.0, wall - sum(self.exclusive.values())), 3)
        return {"wall_s": round(wall, 3), "exclusive_s": exclusive, "counts": dict(self.counts),
                "probes_s": {k: round(v, 3) for k, v in sorted(self.probes.items(), key=lambda kv: -kv[1])},
                "workloads_s": {k: round(v, 3) for k, v in self.workloads.items()},
                "probe_workloads_s": {k: round(v, 3) for k, v in
                                      sorted(self.probe_workloads.items(), key=lambda kv: -kv[1])}}


def _device_sync():
    """torch.cuda.synchronize when CUDA is initialised in this process, else nothing (a CPU run or
    a run that has not touched the GPU yet must not initialise CUDA for a profile)."""
    def sync() -> None:
        torch = sys.modules.get("torch")  # never imported here: a run that has not loaded torch has no GPU work
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    return sync


TOP_PAIRS = 15  # (probe, workload) pairs --profile-phases prints; the JSON holds them all

#: The process's clock: one check run at a time per process (slots are processes of their own).
PHASES = PhaseClock()


def add(into: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """Sum two `to_json` results (the slots of --jobs/--gpus); wall_s is the largest slot's."""
    out = {"wall_s": max(into.get("wall_s", 0.0), part.get("wall_s", 0.0))}
    for key in ("exclusive_s", "counts", "probes_s", "workloads_s", "probe_workloads_s"):
        merged = dict(into.get(key, {}))
        for k, v in (part.get(key) or {}).items():
            merged[k] = round(merged.get(k, 0) + v, 3)
        if key == "probe_workloads_s":  # largest first, as one clock writes them
            merged = dict(sorted(merged.items(), key=lambda kv: -kv[1]))
        out[key] = merged
    return out


def render(phases: dict[str, Any]) -> str:
    """A plain-text table for --profile-phases (stderr)."""
    lines = [f"phases (wall {phases.get('wall_s', 0):.1f} s; each second counted once, in its innermost phase):"]
    counts = phases.get("counts", {})
    for k, v in phases.get("exclusive_s", {}).items():
        n = counts.get(k)
        lines.append(f"  {k:<14} {v:9.2f} s" + (f"  ({n} times)" if n else ""))
    tallies = {k: n for k, n in counts.items() if k not in phases.get("exclusive_s", {})}
    if tallies:
        lines.append("  counted only: " + ", ".join(f"{k} {n}" for k, n in tallies.items()))
    lines.append("probes (inclusive: round trips and judging inside them):")
    lines += [f"  {k:<20} {v:9.2f} s" for k, v in phases.get("probes_s", {}).items()]
    lines.append("workloads:")
    lines += [f"  {k:<40} {v:9.2f} s" for k, v in phases.get("workloads_s", {}).items()]
    pairs = sorted((phases.get("probe_workloads_s") or {}).items(), key=lambda kv: -kv[1])
    if pairs:
        lines.append(f"probes by workload (the {min(TOP_PAIRS, len(pairs))} largest of {len(pairs)}):")
        lines += [f"  {k:<60} {v:9.2f} s" for k, v in pairs[:TOP_PAIRS]]
    return "\n".join(lines)
