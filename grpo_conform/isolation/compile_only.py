"""Kernels compiled side by side, not run: the compile-ahead worker's `precompile` (check_ahead.py), opt-in.

Why: a worker compiles each Triton kernel at its first launch, one after another, and a launch waits for its
compile. Triton's compiler leaves the GIL for most of its work: eight distinct kernels compiled for sm_90
took 5.4 s one after another and 2.7 s on two threads (Triton 3.9 on this project's 2-core machine,
seventeenth session, docs/timing.md). Compiled side by side, a member's kernels cost about the longest
one's time instead of their sum, and the proxies' memory is held for that long only.

How: inside `side_by_side`, every launch through Triton's JIT is made a warm-up (`JITFunction.run(...,
warmup=True)`: compiled, not run), and Triton's own `AsyncCompileMode` hands each compile to a thread
pool; leaving the block waits for all of them, and their results land in the worker's cache as any
compile's do (the slot's worker gets them through the store, isolation/live_share.py). Nothing launched in
the block runs, so whatever the implementation computes there is garbage: the compile-ahead worker judges
nothing and only names an exception. A kernel whose compile fails is left out (the slot's worker meets it
again, and it is judged there). Where Triton lacks either piece, or the implementation never imported
Triton, the block changes nothing (`active` False) and the calls run as before.

Only the compile-ahead worker enters it: a worker that runs judged or timed calls never does.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator


def _pieces():
    """(JITFunction, AsyncCompileMode), or None where the implementation has not imported Triton's JIT or this
    Triton has no AsyncCompileMode."""
    jit = sys.modules.get("triton.runtime.jit")
    fn = getattr(jit, "JITFunction", None) if jit is not None else None
    if fn is None or not callable(getattr(fn, "run", None)):
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # local: Triton's, where it has one
    except Exception:
        return None
    return fn, AsyncCompileMode


@contextmanager
def side_by_side(threads: int) -> Iterator[bool]:
    """Launches inside compile on `threads` threads and do not run; yields whether that is in effect."""
    pieces = _pieces() if threads > 0 else None
    if pieces is None:
        yield False
        return
    fn, mode = pieces
    own = "run" in fn.__dict__  # else inherited: removed again after, not left as a copy
    original = fn.run

    def run(self, *args, grid, warmup, **kwargs):
        return original(self, *args, grid=grid, warmup=True, **kwargs)

    fn.run = run
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpo-conform-compile")
    try:
        try:
            block = mode(pool, ignore_errors=True)
        except TypeError:  # a Triton whose mode has no ignore_errors: a failed compile raises on leaving
            block = mode(pool)
        with block:
            yield True
    finally:
        if own:
            fn.run = original
        else:
            del fn.run
        pool.shutdown(wait=True)
