"""One GPU shared by the slots of a run: conformance side by side, timing alone.

The validator's own host work between short GPU bursts is what a check spends its time on (docs/timing.md,
"Eleventh session"), so several slots on one GPU finish sooner, but a timed protocol must have the GPU to
itself. The runner (parallel.py) holds one `GpuArbiter` per GPU; a slot reaches it through a
`GateClient` over two pipes the runner hands it. Never through stdout: progress lines carry text an
implementation chose (its error messages), which must not be able to speak for the slot.

A slot holds, in order:
- "present", from before its first CUDA work until it has closed its workers and waited for its own
  queued work: while any slot is present, no timing runs, since a present slot's worker may launch work.
  A present hold names the implementation (its identity): slots of different implementations are never
  present together, so an implementation that hoards memory or loads the GPU can hurt only its own
  verdicts, never another's;
- "memory" (N bytes), around each workload's conformance: the workloads running side by side together fit
  in the GPU (`capacity`); each sizes its kept outputs and chunks by its grant (grpo_conform/device_memory.py),
  so what a workload checks does not depend on what runs beside it;
- "exclusive", around its bandwidth probe and timed protocols: granted only when no slot holds anything.
  One exception, asked with `try` (never queued): a slot that holds nothing but its own "present" gets it
  when no other slot holds anything, i.e. the last slot to finish its conformance times at once, in its
  conformance worker (its kernels loaded), since no other slot has a worker then. Two slots that finish
  within moments of each other would each see the other still present and both be refused (round32a at
  a7a99a9 on the H200: 0.2 s apart, no turn in a warm worker), so the first to ask waits up to
  TRY_WAIT_S for the others to let go; one that asks while another waits is refused at once, closes its
  worker and lets go, and the waiting one gets the hold.
- "memory" asked with `try` (never queued): granted only when it fits at once and nothing waits, for
  work a slot may skip (its compile-ahead calls, check_ahead.py).

No slot waits for memory while it holds memory (a compile-ahead proxy's `try` hold): the request ahead of
it may need exactly that memory, and then every slot waits for good (round35c on an H100, thirty-first
session). The slot lets go first (check._memory_hold); a queued memory request from a slot that still holds
memory is refused with a GateError.

Grants: memory requests in arrival order (a large one is never passed by smaller ones, so it is not
starved), one larger than the capacity when it is alone; exclusive requests in arrival order once
nothing is held; a new "present" waits while an exclusive is held or asked for, so that timing is not
postponed by every job still to start, and while another implementation is present or asked first. A
slot that exits loses what it held or asked for (`drop`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

ENV_FDS = "GRPO_CONFORM_GPU_GATE"  # "READ,WRITE": the slot's ends of its two pipes (set by parallel.py)
KINDS = ("present", "memory", "exclusive")
USABLE_FRACTION = 0.9  # of the GPU's memory, for the workloads' grants; the rest: CUDA contexts, fragmentation
CONTEXT_BYTES = 1 << 30  # per slot: its own and its worker's CUDA context and allocator slack
TRY_WAIT_S = 2.0  # how long a `try` waits for the other slots to let go (they are finishing, or it gives up)


class GateError(Exception):
    """The gate's channel broke: the runner is gone or answered something else."""


@dataclass
class Request:
    slot: str
    kind: str
    nbytes: int
    token: int
    grant: Callable[[int], None]
    tag: str = ""  # a present hold's implementation identity


class GpuArbiter:
    """Runner side: who holds what of one GPU. Thread-safe; `grant` callbacks run under the lock."""

    def __init__(self, slots: int, capacity: int | None = None, try_wait: float = TRY_WAIT_S):
        self.slots = slots
        self.capacity = capacity  # None until a slot reports the GPU's total memory
        self.try_wait = try_wait
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified whenever holds or requests change
        self.trying: set[str] = set()  # slots waiting in `try_exclusive`
        self.holds: dict[int, Request] = {}
        self.pending: list[Request] = []
        self._tokens = 0
        self.retired: set[str] = set()  # slots that exited: whatever still speaks for them is not heard

    def set_total(self, total: int) -> None:
        with self.lock:
            if self.capacity is None:
                self.capacity = max(0, int(total * USABLE_FRACTION) - self.slots * CONTEXT_BYTES)

    def request(self, slot: str, kind: str, nbytes: int, grant: Callable[[int], None], tag: str = "") -> int:
        if kind not in KINDS:
            raise GateError(f"unknown hold {kind!r}: expected one of {', '.join(KINDS)}")
        with self.lock:
            self._tokens += 1
            if slot in self.retired:
                return self._tokens  # never granted: the slot is gone
            req = Request(slot, kind, max(0, int(nbytes)), self._tokens, grant, tag)
            self.pending.append(req)
            self._grant()
            if kind == "memory" and req in self.pending and any(
                    h.slot == slot and h.kind == "memory" for h in self.holds.values()):
                # Waiting while holding memory can stall every slot: the request ahead may need that memory
                # (check._memory_hold lets go first). Refused loudly, never left to hang.
                self.pending.remove(req)
                raise GateError(f"slot {slot} asked to wait for memory while it holds memory: it must let go first")
            return self._tokens

    def try_exclusive(self, slot: str) -> int:
        """An exclusive hold, or 0: granted once every hold is `slot`'s own (its presence; it has no request
        in flight to its worker when it asks) and the slot is not retired. Never queued: it waits up to
        `try_wait` for the other slots to let go, and is refused at once while another slot waits so."""
        deadline = time.monotonic() + self.try_wait
        with self.lock:
            if self.trying - {slot}:
                return 0  # another slot asked first: it times now, this one closes its worker and lets go
            self.trying.add(slot)
            try:
                while not (slot in self.retired or self.trying - {slot}):
                    if not any(h.slot != slot for h in self.holds.values()):
                        self._tokens += 1
                        self.holds[self._tokens] = Request(slot, "exclusive", 0, self._tokens, lambda token: None)
                        return self._tokens
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.changed.wait(left)
                return 0
            finally:
                self.trying.discard(slot)
                self.changed.notify_all()

    def try_memory(self, slot: str, nbytes: int) -> int:
        """A memory hold of `nbytes`, or 0: never queued, granted only where a queued memory request would be
        granted at once and nothing waits (no memory request ahead of it, no exclusive held or asked for) and
        the bytes fit beside what is held (never the lone oversized grant). Work that may be skipped asks so:
        a slot's compile-ahead calls (check_ahead.py) never delay a workload or a turn."""
        with self.lock:
            if slot in self.retired or self.capacity is None or self.pending:
                return 0
            if any(h.kind == "exclusive" for h in self.holds.values()):
                return 0
            if self.used() + max(0, int(nbytes)) > self.capacity:
                return 0
            self._tokens += 1
            self.holds[self._tokens] = Request(slot, "memory", max(0, int(nbytes)), self._tokens, lambda token: None)
            return self._tokens

    def release(self, slot: str, token: int) -> None:
        with self.lock:
            held = self.holds.get(token)
            if held is None or held.slot != slot:
                raise GateError(f"slot {slot} released hold {token}, which it does not hold")
            del self.holds[token]
            self._grant()

    def retire(self, slot: str) -> None:
        """The slot's process has exited: drop what it held, and hear nothing more in its name (a child
        that kept its pipe open cannot hold the GPU for it)."""
        with self.lock:
            self.retired.add(slot)
        self.drop(slot)

    def drop(self, slot: str) -> None:
        with self.lock:
            self.pending = [r for r in self.pending if r.slot != slot]
            for token in [t for t, r in self.holds.items() if r.slot == slot]:
                del self.holds[token]
            self._grant()

    def used(self) -> int:
        return sum(r.nbytes for r in self.holds.values() if r.kind == "memory")

    def _grantable(self, r: Request, first_memory: bool, exclusive_waits: bool) -> bool:
        exclusive_held = any(h.kind == "exclusive" for h in self.holds.values())
        if r.kind == "exclusive":
            return not self.holds
        if exclusive_held:
            return False
        if r.kind == "present":
            others = {h.tag for h in self.holds.values() if h.kind == "present"}
            earlier = {p.tag for p in self.pending[:self.pending.index(r)] if p.kind == "present"}
            return not exclusive_waits and others | earlier <= {r.tag}
        if not first_memory:
            return False
        memory_held = any(h.kind == "memory" for h in self.holds.values())
        return not memory_held or self.used() + r.nbytes <= (self.capacity or 0)

    def _grant(self) -> None:
        self.changed.notify_all()  # under the lock: every change of holds or requests passes here
        while True:
            exclusive_waits = any(r.kind == "exclusive" for r in self.pending)
            first_memory = next((r for r in self.pending if r.kind == "memory"), None)
            first_exclusive = next((r for r in self.pending if r.kind == "exclusive"), None)
            ready = next((r for r in self.pending
                          if (r.kind != "exclusive" or r is first_exclusive)
                          and self._grantable(r, r is first_memory, exclusive_waits)), None)
            if ready is None:
                return
            self.pending.remove(ready)
            self.holds[ready.token] = ready
            ready.grant(ready.token)


def serve(arbiter: GpuArbiter, slot: str, requests, grants) -> None:
    """Runner side, one thread per slot process: answer its requests until its pipe closes, then drop
    what it held (a slot that died holds nothing). `requests`/`grants`: text files of the two pipes."""
    lock = threading.Lock()

    def answer(token: int, error: str = "") -> None:
        with lock:
            try:
                grants.write(json.dumps({"error": error} if error else {"token": token}) + "\n")
                grants.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the slot is gone: its reader thread drops its holds

    try:
        for line in requests:
            try:
                msg = json.loads(line)
                if msg.get("gate") == "total":
                    arbiter.set_total(int(msg["bytes"]))
                elif msg.get("gate") == "acquire":
                    arbiter.request(slot, str(msg["kind"]), int(msg.get("bytes", 0)), answer, str(msg.get("tag", "")))
                elif msg.get("gate") == "try" and msg.get("kind") == "exclusive":
                    answer(arbiter.try_exclusive(slot))
                elif msg.get("gate") == "try" and msg.get("kind") == "memory":
                    answer(arbiter.try_memory(slot, int(msg.get("bytes", 0))))
                elif msg.get("gate") == "release":
                    arbiter.release(slot, int(msg["token"]))
                else:
                    raise GateError(f"unknown message {line.strip()[:80]!r}")
            except (ValueError, KeyError, TypeError, GateError) as exc:
                answer(0, f"{type(exc).__name__}: {exc}")  # said to the slot, whose waiting call raises it
                break  # a slot that speaks nonsense loses its holds; its own acquire then fails
    finally:
        arbiter.drop(slot)
        for f in (requests, grants):
            try:
                f.close()
            except OSError:
                pass


class GateClient:
    """Slot side: blocking acquire/release over the pipes the runner handed this process."""

    def __init__(self, read_fd: int, write_fd: int):
        for fd in (read_fd, write_fd):
            os.set_inheritable(fd, False)  # the slot's workers never get them
        self._in = os.fdopen(read_fd, "r", buffering=1)
        self._out = os.fdopen(write_fd, "w", buffering=1)

    @classmethod
    def from_environment(cls) -> "GateClient | None":
        value = os.environ.pop(ENV_FDS, "").strip()
        if not value:
            return None
        try:
            read_fd, write_fd = (int(x) for x in value.split(","))
        except ValueError:
            raise GateError(f"{ENV_FDS}={value!r}: expected two descriptors, READ,WRITE") from None
        return cls(read_fd, write_fd)

    def _send(self, **msg) -> None:
        try:
            self._out.write(json.dumps(msg) + "\n")
            self._out.flush()
        except (BrokenPipeError, OSError) as exc:
            raise GateError(f"the run's GPU gate is gone ({exc})") from None

    def _token(self, what: str) -> int:
        line = self._in.readline()
        if not line:
            raise GateError(f"the run's GPU gate closed before {what}")
        msg = json.loads(line)
        if "error" in msg:  # the runner refused the request (gate/gpu_share.py, serve) and dropped this slot's holds
            raise GateError(f"the run's GPU gate refused this slot: {msg['error']}")
        return int(msg["token"])

    def report_total(self, total: int) -> None:
        self._send(gate="total", bytes=int(total))

    def acquire(self, kind: str, nbytes: int = 0, tag: str = "") -> int:
        self._send(gate="acquire", kind=kind, bytes=int(nbytes), tag=tag)
        return self._token("granting")

    def try_exclusive(self) -> int:
        """The exclusive hold, or 0: never queued; it waits at most TRY_WAIT_S for slots finishing at the same
        moment to let go (GpuArbiter.try_exclusive)."""
        self._send(gate="try", kind="exclusive")
        return self._token("answering")

    def try_memory(self, nbytes: int) -> int:
        """A memory hold, or 0 at once (GpuArbiter.try_memory)."""
        self._send(gate="try", kind="memory", bytes=int(nbytes))
        return self._token("answering")

    def release(self, token: int) -> None:
        self._send(gate="release", token=token)
