"""Compile ahead (on by default where slots share a GPU; GRPO_CONFORM_COMPILE_AHEAD=0 turns it off): a slot's
second worker compiles the kernels of the member the slot checks next, while it checks this one.

Why: on a first run of an implementation's identity on the H200 the default check's conformance ends ~40 s
later than with the compile store kept, and most of that is each member's own kernels compiled at their
first launch, one after another in the slot's worker (docs/timing.md, "Sixteenth session"); passing
kernels between slots (isolation/live_share.py) does not help there, since no other slot compiles them.

How: where slots share a GPU and the slot's worker starts from an empty store, a second worker of the
same implementation is spawned next to it (its process start and imports beside the slot worker's, not
after them). Its queue starts with the slot's first member's workloads after its first (their kernels,
a mask-b8's above all, compile while the slot runs that first one), then each later member's workloads.
After each workload the slot calls `step`: once that worker has answered, its caches go to the store
(WorkerSession.share_compiled), and from there into the slot's worker at its next workload boundary; then
the next shape is sent. A request (`precompile`, not waited for) holds one input set at one distinct
workload shape, drawn by the operation exactly as conformance resolves the workload (`proxy_workload` says
why not smaller); the worker runs a forward without grad, then one with grad and its backward, at the
member's declared parameter values. Nothing of it is judged; conformance runs every call again in the slot's
own worker. Members the slot has moved past are dropped from the queue.

Where slots share a GPU, a request is sent only when the gate grants its memory at once (`try_memory`:
twice the set's inputs and gradients, ~8.4 GB at mask-b8; never queued, so the slot never waits for it),
held until the answer is collected; refused, it is asked again after the next workload.

Measured on the H200 (docs/timing.md, "Seventeenth session"): with batch-1 proxies and the worker started
after the slot's, a first run's conformance ended at 109 s against 115-116 s without compile ahead. It
costs a worker process a slot, one workload's memory at a time, and GPU time beside the slot's
conformance, on a first run only.
"""

from __future__ import annotations

import os
import random
import secrets
from typing import Callable

from grpo_conform import device_memory
from grpo_conform.checks.buffers import InputSlot, input_dtypes
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.ops import operation_for

ENV = "GRPO_CONFORM_COMPILE_AHEAD"
#: Free device memory left beside a proxy before it is sent: the gate's grants are estimates, and the slots'
#: peaks (the judge's temporaries) pass them (H200, seventeenth session: proxies at mask-b8's shape sent on the
#: gate's word alone left 1.8 GiB free and a slot's workload ran out of memory).
HEADROOM = 12 << 30


def enabled() -> bool:
    """On unless GRPO_CONFORM_COMPILE_AHEAD is 0."""
    return os.environ.get(ENV, "").strip() != "0"


def proxy_workload(spec, workload):
    """The workload as conformance will resolve it, at its own shapes (ranged axes drawn as a fixed seed draws
    them). Not at a smaller batch: an implementation picks its kernels' specialisation from the sizes (ours
    splits the row statistics by the token count; Triton makes an int argument of 1 a constant), so a batch-1
    proxy compiled kernels that the real calls never launch (H200, seventeenth session: a first run's mask-b8
    workloads still took 3-4 s longer than with kept caches)."""
    return spec.resolve(workload, random.Random(0))


def _shapes(spec, workloads) -> list:
    """One proxy a distinct shape and dtype set, in the workloads' order."""
    proxies, seen = [], set()
    for w in workloads:
        rw = proxy_workload(spec, w)
        key = (tuple(sorted(rw.shapes.items())), tuple(sorted(rw.dtypes.items())))
        if key not in seen:
            seen.add(key)
            proxies.append(rw)
    return proxies


class AheadCompiler:
    """The second worker of one slot and the shapes it has still to compile (in the slot's order), one request
    a shape, so that what it holds at once is one workload's inputs and gradients."""

    def __init__(self, session: WorkerSession, members: list, first: int, gate=None) -> None:
        self.session, self.members, self.gate = session, members, gate  # gate: the slot's GateClient, or None
        self.token = 0  # the memory hold of the request in flight
        self.next = first + 1  # the next member whose shapes join the queue (members[first] runs now)
        self.queue: list[tuple[int, object, object]] = []  # (member index, member plan, proxy) not yet sent
        self.pending: list[str] | None = None
        self.held: list[InputSlot] = []  # the request's input sets, alive until it is answered
        self.held_bytes = 0  # theirs, in this process (check.memory_stop allows for them)
        self.sent: list[str] = []  # member labels sent, in order (the report's `worker.compile_ahead`)
        self.stopped: str | None = None  # why it closed early

    @staticmethod
    def wanted(members: list, first: int) -> bool:
        """Whether anything is left to compile ahead of members[first]'s first workload."""
        return first + 1 < len(members) or len(members[first].workloads) > 1

    @staticmethod
    def spawn(make_session: Callable[[], WorkerSession]) -> WorkerSession | None:
        """The second worker's process started and making its imports (`warm`, not waited for), or None if it
        did not start. Spawned next to the slot's own worker, so that its start hides behind that one's
        instead of delaying the slot's first workload; `begin` loads it."""
        session = make_session()
        try:
            session.spawn()
            session.warm()
        except Exception:
            session.close(graceful=False)
            return None
        return session

    @classmethod
    def begin(cls, session: WorkerSession | None, members: list, first: int,
              gate=None) -> "AheadCompiler | None":
        """A spawned worker (`spawn`) loaded and given its first request, at once: the current member's
        workloads after its first, whose kernels (a mask-b8's above all) it compiles while the slot runs that
        first one. None when there is nothing to compile ahead or the worker does not load: the slot is left
        as it was."""
        if session is None:
            return None
        if not cls.wanted(members, first):
            session.close(graceful=False)
            return None
        try:
            session.load()
        except Exception:
            session.close(graceful=False)
            return None
        ahead = cls(session, list(members), first, gate)
        mp = members[first]
        ahead.queue = [(first, mp, rw) for rw in _shapes(mp.spec, mp.workloads[1:])]
        ahead._guarded(lambda: ahead._advance(first))
        return ahead

    def step(self, current: int) -> None:
        """Between two workloads of members[current]: collect an answer that has come, then send the next
        member's request. Never waits for the worker."""
        if self.session is not None:
            self._guarded(lambda: self._step(current))

    def _guarded(self, fn) -> None:
        try:
            fn()
        except Exception as exc:  # WorkerFailure above all: what fails here is met again, and judged, in conformance
            self.stopped = f"{type(exc).__name__}: {exc}"[:300]
            self.close()

    def _step(self, current: int) -> None:
        if self.pending is not None:
            if not self.session.answered():
                return
            self.session.receive(op="precompile")
            self.session.request(op="unbind", slots=self.pending)
            self.pending, self.held, self.held_bytes = None, [], 0
            self._release()
            self.session.share_compiled()
        self._advance(current)

    def _advance(self, current: int) -> None:
        """The next shape sent, if the gate has room for it at once. A member the slot has moved past is
        dropped; the one it runs keeps its shapes not yet sent (its later workloads still gain)."""
        self.queue = [q for q in self.queue if q[0] >= current]
        self.next = max(self.next, current + 1)
        while not self.queue and self.next < len(self.members):
            mp = self.members[self.next]
            self.queue = [(self.next, mp, rw) for rw in _shapes(mp.spec, mp.workloads)]
            self.next += 1
        if not self.queue:
            self.close()  # nothing left to compile
            return
        if self._send(*self.queue[0][1:]):
            self.queue.pop(0)

    def _send(self, mp, rw) -> bool:
        """The request for one proxy of member `mp` sent (True), or not now: the gate had no room for it at
        once (twice its inputs and gradients: the set, its pristine copy, the worker's leaves and gradient)."""
        spec, device = mp.spec, self.session.device
        need = 2 * sum(device_memory.set_and_gradient_bytes(spec, rw))
        if self.gate is not None:
            if device.type == "cuda" and device_memory.device_free_bytes(device) < need + HEADROOM:
                return False  # the gate's grants are estimates: what is really free decides too
            self.token = self.gate.try_memory(need)
            if not self.token:
                return False
        slot = InputSlot.create(self.session, "A0", rw.shapes, input_dtypes(spec, rw), pristine=False)
        operation_for(spec).generate(spec, rw, secrets.randbits(63), device, out=slot.tensors)
        self.held = [slot]  # the worker reads it after a synchronize (WorkerSession._send)
        self.held_bytes = sum(t.numel() * t.element_size() for t in slot.tensors.values())
        self.session.post(op="precompile", slots=[slot.name], params=dict(spec.parameter_values),
                          gradients=[g.input for g in spec.gradients])
        self.pending = [slot.name]
        if not self.sent or self.sent[-1] != mp.label:
            self.sent.append(mp.label)
        return True

    def _release(self) -> None:
        if self.token and self.gate is not None:
            self.gate.release(self.token)
        self.token = 0

    def close(self) -> None:
        if self.session is not None:
            self.session.close(graceful=self.pending is None)  # a busy worker is not waited for
            self.session, self.pending, self.held, self.held_bytes = None, None, [], 0
        self._release()  # after the worker is gone: its proxies' memory is free
