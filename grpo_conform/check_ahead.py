"""Compile ahead (on by default where slots share a GPU; GRPO_CONFORM_COMPILE_AHEAD=0 turns it off): a slot's
second worker compiles the kernels of the member the slot checks next, while it checks this one.

Why: on a first run of an implementation's identity on the H200 the default check's conformance ends ~40 s
later than with the compile store kept, and most of that is each member's own kernels compiled at their
first launch, one after another in the slot's worker (docs/timing.md, "Sixteenth session"); passing
kernels between slots (isolation/live_share.py) does not help there, since no other slot compiles them.

How: where slots share a GPU and the slot's worker starts from an empty store, a second worker of the
same implementation is spawned next to it (its process start and imports beside the slot worker's, not
after them). It is sent at once the slot's first member's workloads after its first (their kernels, a
mask-b8's above all, compile while the slot runs that first one). After each workload the slot calls
`step`: once that worker has answered, its caches go to the store (WorkerSession.share_compiled), and from
there into the slot's worker at its next workload boundary; then the next member not yet begun is sent.
Each request (`precompile`, not waited for) holds one input set per distinct workload shape, drawn by the
operation at the workload's shapes with the batch axis at 1 (the kernels' geometry, the vocabulary and the
sequence, as the real ones, at a fraction of their memory); the worker runs a forward without grad, then
one with grad and its backward, at the member's declared parameter values. Nothing of it is judged;
conformance runs every call again in the slot's own worker.

A member not yet begun also gets, in a request of its own after its workloads', its once-per-member calls
(reach's and other-dtypes', checks/member_calls.py: drawn per member from a secret of the process, so they are
known here before the member runs) as proxies at their own shapes and dtypes, which are small. On an H100 reach took 4.6-6.4 s of each masked member's first
workload (thirty-first session), nearly all of it compiling kernels nothing else launches. Only where kernels
compile at their first launch (CUDA), and not for the slot's first member, whose first workload calls them
before the slot's worker could take anything from the store.

Side by side at the workloads' own shapes (GRPO_CONFORM_COMPILE_AHEAD_THREADS with _SHAPES=workload, `settles`),
the first request is the slot's first workload's own shape, and the slot waits for it (`settle_first`, at most
FIRST_WAIT_S) before that workload: its worker then takes those kernels from the store instead of compiling them
one after another at their first launches, which cost a first workload ~10 s on the H200.

Where slots share a GPU, a request is sent only when the gate grants its memory at once (`try_memory`:
twice the proxies' inputs and gradients, ~1.1 GiB at mask-b8; never queued, so the slot never waits for
it) and the device has HEADROOM free beside it, held until the answer is collected; refused, it is asked
again after the next workload.

Measured on the H200 (docs/timing.md, "Seventeenth session"): a first run's conformance ended at 109 s
against 115-116 s without it (151 s against 155-157 s for the whole check). Batch-1 proxies do not compile
every kernel the real calls launch: an implementation may pick its kernels' specialisation from the sizes
(ours splits the row statistics by the token count; Triton makes an int argument equal to 1 a constant).
Proxies at the workloads' own shapes were tried (5d1304f): ~8 GB a mask-b8 request, ~4 s of drawing a slot,
and a slot ran out of memory beside them; not measured to gain, so they are opt-in
(GRPO_CONFORM_COMPILE_AHEAD_SHAPES=workload: one request a shape; since the eighteenth session drawn at batch 1
and repeated along the batch axis, `fill_proxy`), as is compiling side by side without running
(GRPO_CONFORM_COMPILE_AHEAD_THREADS, isolation/compile_only.py), which holds their memory for less time. It
costs a worker process a slot, the proxies' memory, and GPU time beside the slot's conformance, on a first run
only.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Callable

from grpo_conform import device_memory
from grpo_conform.ahead_proxies import distinct, fill_proxy
from grpo_conform.checks import member_calls
from grpo_conform.checks.buffers import InputSlot, input_dtypes
from grpo_conform.errors import EnvironmentProblem
from grpo_conform.isolation.session import WorkerSession

ENV = "GRPO_CONFORM_COMPILE_AHEAD"
#: Threads the second worker compiles Triton kernels on, side by side and without running them
#: (isolation/compile_only.py); 0, the default until measured on a GPU: its calls run as conformance's do.
ENV_THREADS = "GRPO_CONFORM_COMPILE_AHEAD_THREADS"
#: "batch1" (the default): proxies with the batch axis at 1, one request a member; "workload": proxies at the
#: workloads' own shapes, one request a shape (what the real calls compile; ~8 GB a mask-b8 request; not yet
#: measured to help, docs/timing.md "Seventeenth session").
ENV_SHAPES = "GRPO_CONFORM_COMPILE_AHEAD_SHAPES"
SHAPES = ("batch1", "workload")
#: "0" leaves out the once-per-member calls' proxies (reach, other-dtypes: member_calls.py); on where calls
#: compile at first launch (CUDA) otherwise. Measured against each other on one machine: docs/timing.md,
#: "Thirty-second session".
ENV_ONCE = "GRPO_CONFORM_COMPILE_AHEAD_ONCE"
#: Free device memory left beside a request before it is sent: the gate's grants are estimates, and the slots'
#: peaks (the judge's temporaries) pass them (H200, seventeenth session: full-size proxies sent on the gate's
#: word alone left 1.8 GiB free, and a slot's workload ran out of memory).
HEADROOM = 4 << 30
#: The longest a slot waits before its first workload for that workload's kernels (`settle_first`): a member's
#: kernels compiled side by side take a few seconds; one after another in the slot's worker they took ~10 s of a
#: first workload on the H200 (seventeenth session: 13.8-14.9 s cold against 4.4-5.2 s kept).
FIRST_WAIT_S = 30.0


def enabled() -> bool:
    """On unless GRPO_CONFORM_COMPILE_AHEAD is 0."""
    return os.environ.get(ENV, "").strip() != "0"


def threads() -> int:
    """GRPO_CONFORM_COMPILE_AHEAD_THREADS as a count (0 when unset); anything else is refused by name."""
    raw = os.environ.get(ENV_THREADS, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) > 64:
        raise EnvironmentProblem(f"{ENV_THREADS}={raw!r}: expected a whole number of threads from 0 to 64")
    return int(raw)


def shapes() -> str:
    """GRPO_CONFORM_COMPILE_AHEAD_SHAPES, one of SHAPES (batch1 when unset); anything else is refused by name."""
    raw = os.environ.get(ENV_SHAPES, "").strip() or SHAPES[0]
    if raw not in SHAPES:
        raise EnvironmentProblem(f"{ENV_SHAPES}={raw!r}: expected one of {', '.join(SHAPES)}")
    return raw


def once_calls_enabled(device) -> bool:
    """Whether members not yet begun get their once-per-member calls' proxies: on CUDA unless ENV_ONCE is 0."""
    raw = os.environ.get(ENV_ONCE, "").strip()
    if raw not in ("", "0", "1"):
        raise EnvironmentProblem(f"{ENV_ONCE}={raw!r}: expected 0 (off) or 1 (on; the default on CUDA)")
    return raw == "1" or (raw == "" and device.type == "cuda")


def settles() -> bool:
    """Whether a slot waits for its first workload's kernels before running it: only where they compile side by
    side (threads) at that workload's own shapes, so that the wait buys exactly the kernels it will launch
    (a batch-1 proxy compiles other specialisations: docs/timing.md, "Seventeenth session")."""
    return threads() > 0 and shapes() == "workload"


def has_room(device, need: int) -> bool:
    """Whether the device has `need` bytes free and HEADROOM beside them (the gate's grants are estimates:
    what is really free decides too). Not a CUDA device: yes."""
    return device.type != "cuda" or device_memory.device_free_bytes(device) >= need + HEADROOM


class AheadCompiler:
    """The second worker of one slot and the requests it has still to send (in the slot's order): one a member
    at batch 1, one a shape at the workloads' own shapes (`shapes()`)."""

    def __init__(self, session: WorkerSession, members: list, first: int, gate=None,
                 once_calls: bool | None = None) -> None:
        self.session, self.members, self.gate = session, members, gate  # gate: the slot's GateClient, or None
        # the members not yet begun also get their once-per-member calls' proxies (reach, other-dtypes): where
        # kernels compile at their first launch, i.e. on CUDA unless said
        self.once_calls = once_calls_enabled(session.device) if once_calls is None else once_calls
        self.token = 0  # the memory hold of the request in flight
        self.next = first + 1  # the next member whose requests join the queue (members[first] runs now)
        self.shapes = shapes()  # SHAPES: at batch 1, or at the workloads' own shapes
        # (member index, member plan, proxies, whether they are its once-per-member calls) not yet sent
        self.queue: list[tuple[int, object, list, bool]] = []
        self.pending: list[str] | None = None
        self.held: list[InputSlot] = []  # the request's input sets, alive until it is answered
        self.held_bytes = 0  # theirs, in this process (check.memory_stop allows for them)
        self.sent: list[str] = []  # member labels sent, in order (the report's `worker.compile_ahead`)
        self.threads = threads()  # side by side, not run, on this many threads (0: calls run)
        self.settles = self.threads > 0 and self.shapes == "workload"  # `settles()`, read once
        self.side_by_side: bool | None = None  # whether the worker said that was in effect (None: no answer yet)
        self.stopped: str | None = None  # why it closed early

    @staticmethod
    def wanted(members: list, first: int) -> bool:
        """Whether anything is left to compile ahead of members[first]'s first workload (with `settles()`, that
        workload's own kernels are)."""
        return settles() or first + 1 < len(members) or len(members[first].workloads) > 1

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
              gate=None, once_calls: bool | None = None) -> "AheadCompiler | None":
        """A spawned worker (`spawn`) loaded and given its first request, at once: the current member's
        workloads after its first, whose kernels (a mask-b8's above all) it compiles while the slot runs that
        first one (with `settles()`, its first workload too, which `settle_first` waits for). None when there is
        nothing to compile ahead or the worker does not load: the slot is left as it was."""
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
        ahead = cls(session, list(members), first, gate, once_calls)
        start = 0 if ahead.settles else 1  # the first workload's own kernels too, when the slot waits for them
        if len(members[first].workloads) > start:
            # not its once-per-member calls: they run in the first workload, before the slot's worker could take
            # what this one compiled (at the next workload boundary)
            ahead.queue = ahead._requests(first, members[first].workloads[start:], once=False)
            ahead._guarded(ahead._send_next)
        return ahead

    def settle_first(self, current: int, wait_s: float = FIRST_WAIT_S) -> bool:
        """With `settles()`: wait, at most `wait_s`, for the request in flight (the slot's first workload's shape) and
        put its kernels in the store, so that the slot's worker takes them before that workload
        (WorkerSession.share_compiled) instead of compiling them one after another at their first launches; then
        the next request goes. Whether it answered in time (else the slot goes on, and `step` collects later)."""
        if not self.settles or self.session is None or self.pending is None:
            return False
        end = time.monotonic() + wait_s
        while not self.session.answered():
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        self._guarded(lambda: self._step(current))
        return True

    def step(self, current: int) -> None:
        """Between two workloads of members[current]: collect an answer that has come, then send the next
        request. Never waits for the worker."""
        if self.session is not None:
            self._guarded(lambda: self._step(current))

    def _guarded(self, fn) -> None:
        try:
            fn()
        except Exception as exc:  # WorkerFailure above all: what fails here is met again, and judged, in conformance
            self.stopped = f"{type(exc).__name__}: {exc}"[:300]
            self.close()

    def let_go(self) -> None:
        """Before the slot waits in the gate's queue: the request in flight answered (waited for) and its memory
        released. A slot that waits holding memory can stall every slot (check._memory_hold says how)."""
        if self.session is not None and self.pending is not None:
            self._guarded(self._collect)

    def _step(self, current: int) -> None:
        if self.pending is not None:
            if not self.session.answered():
                return
            self._collect()
        # a member the slot has moved past is dropped, one it has begun is not queued (its workloads' requests queued
        # before it began still go: its later workloads gain; its once-per-member calls ran in its first workload)
        self.queue = [q for q in self.queue if q[0] > current or (q[0] == current and not q[3])]
        self.next = max(self.next, current + 1)
        if not self.queue and self.next < len(self.members):
            self.queue = self._requests(self.next, self.members[self.next].workloads)
            self.next += 1
        if not self.queue:
            self.close()  # nothing left to compile
            return
        self._send_next()

    def _collect(self) -> None:
        if self.pending is not None:
            reply = self.session.receive(op="precompile")
            self.side_by_side = bool(reply.get("side_by_side")) if self.side_by_side is None else self.side_by_side
            self.session.request(op="unbind", slots=self.pending)
            self.pending, self.held, self.held_bytes = None, [], 0
            self._release()
            self.session.share_compiled()

    def _requests(self, index: int, workloads, once: bool = True) -> list:
        mp = self.members[index]
        full = self.shapes == "workload"
        seen: set = set()
        proxies = distinct(mp.spec, workloads, full, seen)
        out = [(index, mp, [rw], False) for rw in proxies] if full else [(index, mp, proxies, False)]
        if once and self.once_calls and mp.workloads:
            # a request of their own, after the workloads' (a mask-b8's kernels matter most): a slot that must let
            # go before it waits at the gate waits for one request's answer only (`let_go`); at their own shapes
            planned = member_calls.planned_workloads(mp.spec, self.session.device.type, mp.workloads[0])
            extra = distinct(mp.spec, planned, True, seen)
            if extra:
                out.append((index, mp, extra, True))
        return out

    def _send_next(self) -> None:
        """The queue's first request sent, if the gate and the device have room for its proxies at once
        (twice their inputs and gradients); else it waits for the next step."""
        _, mp, proxies, _ = self.queue[0]
        spec, device = mp.spec, self.session.device
        if self.gate is not None:
            need = 2 * sum(sum(device_memory.set_and_gradient_bytes(spec, rw)) for rw in proxies)
            if not has_room(device, need):
                return
            self.token = self.gate.try_memory(need)
            if not self.token:
                return
        self.queue.pop(0)
        for i, rw in enumerate(proxies):
            slot = InputSlot.create(self.session, f"A{i}", rw.shapes, input_dtypes(spec, rw), pristine=False)
            fill_proxy(spec, rw, secrets.randbits(63), device, slot.tensors)  # the worker reads it after
            self.held.append(slot)  # a synchronize (WorkerSession._send)
        self.held_bytes = sum(t.numel() * t.element_size() for slot in self.held for t in slot.tensors.values())
        names = [slot.name for slot in self.held]
        self.session.post(op="precompile", slots=names, params=dict(spec.parameter_values),
                          gradients=[g.input for g in spec.gradients], threads=self.threads)
        self.pending = names
        if not self.sent or self.sent[-1] != mp.label:
            self.sent.append(mp.label)

    def report(self) -> dict:
        """The report's `worker.compile_ahead`."""
        return {"members_sent": list(self.sent), "stopped": self.stopped, "threads": self.threads,
                "side_by_side": self.side_by_side, "shapes": self.shapes}

    def _release(self) -> None:
        if self.token and self.gate is not None:
            self.gate.release(self.token)
        self.token = 0

    def close(self) -> None:
        if self.session is not None:
            self.session.close(graceful=self.pending is None)  # a busy worker is not waited for
            self.session, self.pending, self.held, self.held_bytes = None, None, [], 0
        self._release()  # after the worker is gone: its proxies' memory is free
