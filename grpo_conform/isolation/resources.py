"""What a worker holds, sampled between calls (the `no-resource-growth` check).

A loss kernel is called thousands of times per training run. One that keeps a tensor per call (a
history of losses with their graphs, a cache keyed by address), opens a file per call or starts a
thread per call is right on every call the validator judges and takes the trainer down after hours.
Nothing measured that: the adversarial round of 2026-12-05 proposed the check.

The repeated-calls probe asks for a sample after its first pass over its input sets (every buffer,
shape-keyed cache and compiled kernel exists by then) and again after its last call; the judge
(`checks/judging.py`, `resource_growth`) compares them. Counted: open file descriptors
(/proc/self/fd), threads (/proc/self/task), live torch.Tensor objects (the garbage collector's list:
tensors are Python objects it tracks; the worker freezes what existed before the implementation was
imported, `worker.op_load`, so only what was made since is visited), the objects frozen out of the
collector's view (an implementation's own `gc.freeze()` would hide what it keeps from the tensor count)
and the bytes the CUDA caching allocator has handed out. A tripwire: memory kept outside torch (ctypes,
numpy arrays, Python lists of floats) or a leak that starts after the last sampled call is not seen.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

# Growth allowed between the two samples: one-off lazy initialisations (a library opening its
# device file or starting a pool on first use) happen before the first sample; these leave room for
# one more each, never for one per call.
# frozen_objects: the collector's permanent generation (gc.get_freeze_count()). The worker freezes once,
# before the implementation is imported; an implementation that freezes afterwards takes what it keeps
# out of the tensor count (tests/gallery/hides-leak-with-gc-freeze), so any increase there is growth (a
# gc.unfreeze() puts everything back in the count: the samples only get slower).
ALLOWED = {"file_descriptors": 2, "threads": 2, "tensors": 4, "cuda_bytes": 1 << 20, "frozen_objects": 0}


def _count(path: str) -> int | None:
    try:
        return len(os.listdir(path))
    except OSError:  # not Linux, or /proc hidden: not judged
        return None


def sample(torch: Any) -> dict[str, int | None]:
    """The worker's holdings now (None: not measurable here)."""
    gc.collect()  # reference cycles a call left behind are garbage, not growth
    tensor = torch.Tensor  # type(), not isinstance: no object's __class__ property is run (some warn)
    tensors = sum(1 for o in gc.get_objects() if issubclass(type(o), tensor))
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = int(torch.cuda.memory_allocated())
    threads = _count("/proc/self/task")
    return {"file_descriptors": _count("/proc/self/fd"), "threads": threads if threads is not None
            else threading.active_count(), "tensors": tensors, "cuda_bytes": cuda,
            "frozen_objects": gc.get_freeze_count()}


def growth(first: dict[str, Any], last: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each measured quantity that grew by more than ALLOWED between two samples: {name: {first, last,
    allowed}}."""
    out = {}
    for name, allowed in ALLOWED.items():
        a, b = first.get(name), last.get(name)
        if isinstance(a, int) and isinstance(b, int) and b - a > allowed:
            out[name] = {"first": a, "last": b, "allowed": allowed}
    return out
