"""Triton cache keys that do not depend on which kernel a worker launches first.

Why: a JIT function's cache key hashes its source, the keys of the JIT functions it calls, and the
constexpr globals all of them read. Triton before triton-lang/triton#10494 (merged 2026-06) merged a
callee's globals before computing the callee's key, so a helper shared by two kernels entered the
second kernel's key with its globals and the first kernel's without them: the same kernel got one
of two keys, depending on which kernel the process launched first. On the H200 (Triton 3.6,
fifteenth session, docs/timing.md) every conformance worker launched `_staged_member_kernel`
first, and a timed turn's fresh worker timing a masked member launched `_staged_stats_kernel`
first (the `forward` protocol): 4 and 7 staged kernels of two cold turns were compiled again, ~1 s
each on the critical path, although the compile store held them under the other key.

How: `steady()` wraps Triton's `DependenciesFinder._update_hash` so that the callee's key is
computed before its globals are read, as Triton does itself since that change (where it already
does, the wrapper computes nothing new: the key is cached). Only the hash is affected, never what
is compiled. The worker calls it once Triton is imported: at `warm` and after `load`
(isolation/worker.py); the validator's own process is left alone.
"""

from __future__ import annotations

import sys

MARK = "_grpo_conform_steady"


def steady() -> bool:
    """Install the wrapper in this process if Triton's JIT is imported; True once it is in place."""
    jit = sys.modules.get("triton.runtime.jit")
    finder = getattr(jit, "DependenciesFinder", None) if jit is not None else None
    if finder is None or not callable(getattr(finder, "_update_hash", None)):
        return False
    return wrap(finder)


def wrap(finder: type) -> bool:
    """Make `finder._update_hash(func)` compute `func.cache_key` first (idempotent)."""
    original = finder._update_hash
    if getattr(original, MARK, False):
        return True

    def _update_hash(self, func):
        func.cache_key  # noqa: B018  (computed, and its used_global_vals set, before they are merged)
        return original(self, func)

    setattr(_update_hash, MARK, True)
    finder._update_hash = _update_hash
    return True
