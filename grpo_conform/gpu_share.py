"""Several slot processes on one GPU, timed calls alone on it (docs/timing.md, "Slots sharing a GPU").

The default check of one implementation is mostly host work between short GPU bursts (worker round
trips, judging, input sets), which one process leaves single-threaded. Slots on one GPU overlap that
work; the timed calls must still see an idle GPU, so the slots of a GPU share a reader-writer lock:

- readers: a slot holds the lock shared for all of its GPU work, and gives it up only at a yield
  point (`point`, called as each phase starts: every worker request, input set and judgment) when
  a writer is waiting; it synchronizes its device before letting go, so none of its work is in flight;
- writers: `exclusive()` around what is timed (the worker's timed batches, the bandwidth and GEMM
  ceilings): once every other slot has reached a yield point and let go, the GPU runs this slot's
  work alone. Writers are preferred: a writer waiting on the gate stops new readers.

Two `flock` files per GPU: `<prefix>.gate` (writers exclusive while they wait and work; readers
take it shared only to pass) and `<prefix>.rw` (readers shared, a writer exclusive). The files live
in the run's private folder (mode 0700), so no worker can open them to stall the others; a slot
that dies lets go of its locks with its descriptors.

Memory is shared too: each workload reserves what it may hold at most (`reserve`, the operation's
`memory_bytes`: the validator's buffers and the implementation's working set) against a capacity
(CAPACITY_FRACTION of the GPU), and waits while the other slots' reservations leave too little; a
workload alone on the GPU always runs. Each slot's reservation is a number in its own file
(`<prefix>.mem.<pid>`), which it holds locked while it lives: a dead slot's file is unlocked, and
ignored. Without it four slots ran the GPU out of memory on the H200 (docs/timing.md).

Off (every call a no-op) unless the slot was started with GRPO_CONFORM_GPU_SHARE=<prefix>
(`gate/parallel.py` sets it only when one implementation runs: workers of different implementations
never share a GPU, so no implementation's background work can slow another's timed calls).
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

ENV_SHARE = "GRPO_CONFORM_GPU_SHARE"  # lock-file prefix of the GPU this slot shares
ENV_SLOTS = "GRPO_CONFORM_GPU_SLOTS"  # how many slots share it (memory budgets are divided by it)


CAPACITY_FRACTION = 0.8  # of the GPU's memory, for the slots' reservations (CUDA contexts and the rest beside)


class GpuShare:
    def __init__(self, prefix: str, sync: Callable[[], None], capacity: int = 0) -> None:
        self.sync = sync  # waits until this process's device work is done
        self.prefix, self.capacity = prefix, capacity  # capacity: bytes all reservations may add up to
        self._gate = os.open(prefix + ".gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._rw = os.open(prefix + ".rw", os.O_RDWR | os.O_CREAT, 0o600)
        self._office = os.open(prefix + ".office", os.O_RDWR | os.O_CREAT, 0o600)
        self._mine_path = f"{prefix}.mem.{os.getpid()}"
        self._mine = os.open(self._mine_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(self._mine, fcntl.LOCK_EX)  # held while this slot lives: how others know it does
        self.depth = 0  # exclusive sections open (nested ones are part of the outer)
        self.yields = 0  # times this slot let a writer go first
        fcntl.flock(self._gate, fcntl.LOCK_SH)  # a new reader passes the gate: never past a waiting writer
        fcntl.flock(self._rw, fcntl.LOCK_SH)
        fcntl.flock(self._gate, fcntl.LOCK_UN)

    # -- memory ---------------------------------------------------------------------------------
    def _others(self) -> int:
        """Bytes the other live slots have reserved (under the office lock)."""
        total = 0
        folder, stem = os.path.split(self.prefix)
        for name in os.listdir(folder or "."):
            path = os.path.join(folder, name)
            if not name.startswith(stem + ".mem.") or path == self._mine_path:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    continue  # nobody holds it: its slot is gone
                except BlockingIOError:
                    pass
                text = os.pread(fd, 32, 0).decode().strip()
                total += int(text) if text.isdigit() else 0
            finally:
                os.close(fd)
        return total

    def _write(self, nbytes: int) -> None:
        os.ftruncate(self._mine, 0)
        os.pwrite(self._mine, str(int(nbytes)).encode(), 0)

    def acquire(self, nbytes: int, poll: float = 0.05) -> bool:
        """Reserve `nbytes` of GPU memory, waiting (and yielding to timed slots) while the others'
        reservations leave too little. True when it waited."""
        waited = False
        while True:
            fcntl.flock(self._office, fcntl.LOCK_EX)
            try:
                others = self._others()
                if others == 0 or others + nbytes <= self.capacity:
                    self._write(nbytes)
                    return waited
            finally:
                fcntl.flock(self._office, fcntl.LOCK_UN)
            waited = True
            self.point()  # a timed slot waiting for the GPU must not wait for this loop
            time.sleep(poll)

    def release(self) -> None:
        fcntl.flock(self._office, fcntl.LOCK_EX)
        try:
            self._write(0)
        finally:
            fcntl.flock(self._office, fcntl.LOCK_UN)

    def point(self) -> bool:
        """A yield point: if a writer waits (or works), let it have the GPU, then carry on. True when
        this slot waited."""
        if self.depth:
            return False
        waited = False
        try:
            fcntl.flock(self._gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self.sync()
            fcntl.flock(self._rw, fcntl.LOCK_UN)
            fcntl.flock(self._gate, fcntl.LOCK_SH)  # until the writers ahead are done
            fcntl.flock(self._rw, fcntl.LOCK_SH)
            self.yields += 1
            waited = True
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        return waited

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.depth:
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            return
        self.sync()
        fcntl.flock(self._rw, fcntl.LOCK_UN)  # holding it shared while waiting for the gate would deadlock
        fcntl.flock(self._gate, fcntl.LOCK_EX)  # writers queue here; readers stop at their next yield point
        fcntl.flock(self._rw, fcntl.LOCK_EX)  # every reader has synchronized and let go
        self.depth = 1
        try:
            yield
        finally:
            self.depth = 0
            self.sync()
            fcntl.flock(self._rw, fcntl.LOCK_SH)  # back to a reader before the gate opens
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def close(self) -> None:
        try:
            os.unlink(self._mine_path)
        except FileNotFoundError:
            pass
        for fd in (self._rw, self._gate, self._office, self._mine):
            os.close(fd)  # closing lets go of its flock


_ACTIVE: GpuShare | None = None


def start(sync: Callable[[], None], total_bytes: int = 0) -> GpuShare | None:
    """Join the GPU's lock if this process was started as a sharing slot (ENV_SHARE); else None.
    `total_bytes`: the GPU's memory (reservations add up to CAPACITY_FRACTION of it)."""
    global _ACTIVE
    prefix = os.environ.get(ENV_SHARE, "").strip()
    if not prefix or _ACTIVE is not None:
        return _ACTIVE
    _ACTIVE = GpuShare(prefix, sync, int(CAPACITY_FRACTION * total_bytes))
    return _ACTIVE


@contextmanager
def reserved(nbytes: int, on_wait: Callable[[], Any] | None = None) -> Iterator[None]:
    """GPU memory for one workload (a no-op where this process shares no GPU). `on_wait`: a context
    manager factory entered around the wait (the engine's `gpu-memory` phase)."""
    if _ACTIVE is None:
        yield
        return
    with (on_wait() if on_wait is not None else _null()):
        _ACTIVE.acquire(nbytes)
    try:
        yield
    finally:
        _ACTIVE.release()


@contextmanager
def _null() -> Iterator[None]:
    yield


def stop() -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.close()
        _ACTIVE = None


def point() -> bool:
    return _ACTIVE.point() if _ACTIVE is not None else False


@contextmanager
def exclusive() -> Iterator[None]:
    """The GPU alone for what runs inside (a no-op where this process shares no GPU)."""
    if _ACTIVE is None:
        yield
        return
    with _ACTIVE.exclusive():
        yield


def sharing_slots() -> int:
    """How many slots share this process's GPU (1 where it shares none)."""
    if _ACTIVE is None:
        return 1
    try:
        return max(1, int(os.environ.get(ENV_SLOTS, "1")))
    except ValueError:
        return 1
