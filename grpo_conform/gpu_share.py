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

Off (every call a no-op) unless the slot was started with GRPO_CONFORM_GPU_SHARE=<prefix>
(`gate/parallel.py` sets it only when one implementation runs: workers of different implementations
never share a GPU, so no implementation's background work can slow another's timed calls).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from typing import Callable, Iterator

ENV_SHARE = "GRPO_CONFORM_GPU_SHARE"  # lock-file prefix of the GPU this slot shares
ENV_SLOTS = "GRPO_CONFORM_GPU_SLOTS"  # how many slots share it (memory budgets are divided by it)


class GpuShare:
    def __init__(self, prefix: str, sync: Callable[[], None]) -> None:
        self.sync = sync  # waits until this process's device work is done
        self._gate = os.open(prefix + ".gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._rw = os.open(prefix + ".rw", os.O_RDWR | os.O_CREAT, 0o600)
        self.depth = 0  # exclusive sections open (nested ones are part of the outer)
        self.yields = 0  # times this slot let a writer go first
        fcntl.flock(self._gate, fcntl.LOCK_SH)  # a new reader passes the gate: never past a waiting writer
        fcntl.flock(self._rw, fcntl.LOCK_SH)
        fcntl.flock(self._gate, fcntl.LOCK_UN)

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
        for fd in (self._rw, self._gate):
            os.close(fd)  # closing lets go of its flock


_ACTIVE: GpuShare | None = None


def start(sync: Callable[[], None]) -> GpuShare | None:
    """Join the GPU's lock if this process was started as a sharing slot (ENV_SHARE); else None."""
    global _ACTIVE
    prefix = os.environ.get(ENV_SHARE, "").strip()
    if not prefix or _ACTIVE is not None:
        return _ACTIVE
    _ACTIVE = GpuShare(prefix, sync)
    return _ACTIVE


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
