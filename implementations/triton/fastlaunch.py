"""Kernel launches without the JIT's per-call argument binding (host overhead, issue 14).

`kernel[grid](*args, **constexprs)` binds and specialises every argument and hashes a cache key on
each call. A plan's launches never change their specialisation (shapes, strides, the 16-byte
alignment of every pointer are in the plan's key, impl.py), so after the first launch through the
JIT, a `Launch` calls the compiled kernel's own launcher directly with the same argument list the
JIT passes it (every parameter in definition order, constexprs included; launch hooks off).

The direct path is used only on CUDA, only when a one-time self-test in this process gave the
right answer through it (a kernel with pointer, int, float and constexpr parameters), and never
with `GRPO_TRITON_FAST_LAUNCH=0`; otherwise every launch goes through the JIT. Any exception on
the direct path switches it off for the process and relaunches through the JIT.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

_STATE: dict = {}  # "ok": bool once the self-test ran; "why": the reason it is off


@triton.jit
def _probe_kernel(out_ptr, src_ptr, n, scale, ADD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x * scale + ADD, mask=offs < n)


def _hooks_off() -> bool:
    try:
        from triton import knobs

        return all(_empty(h) for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))
    except Exception:
        return False


def _empty(hook) -> bool:
    # Triton >= 3.5 keeps a HookChain there even when nothing is registered: an empty chain is "no hook"
    # (with `is None` alone the direct launcher was never on: H200 2026-12-01, "launch hooks set").
    return hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)


def _direct(compiled, grid, stream, args):
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, None, None, None, *args)


def enabled(device) -> bool:
    if "ok" in _STATE:
        return _STATE["ok"]
    ok, why = False, ""
    if os.environ.get("GRPO_TRITON_FAST_LAUNCH", "1") == "0":
        why = "GRPO_TRITON_FAST_LAUNCH=0"
    elif device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        why = "not CUDA"
    elif not _hooks_off():
        why = "launch hooks set"
    else:
        import torch

        try:
            src = torch.arange(100, dtype=torch.float32, device=device)
            out = torch.zeros(100, dtype=torch.float32, device=device)
            compiled = _probe_kernel[(1,)](out, src, 100, 2.0, ADD=3.0, BLOCK=128)
            out.zero_()
            stream = torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else 0)
            _direct(compiled, (1,), stream, (out, src, 77, 0.5, 3.0, 128))
            want = torch.where(torch.arange(100, device=device) < 77, src * 0.5 + 3.0, torch.zeros_like(src))
            ok = bool(torch.equal(out, want))  # one synchronisation, once per process
            why = "" if ok else "self-test gave a wrong answer"
        except Exception as exc:
            why = f"self-test failed: {type(exc).__name__}: {str(exc)[:200]}"
    _STATE["ok"], _STATE["why"] = ok, why
    return ok


class Launch:
    """One kernel launch of a plan: `launch(*args)` with the runtime arguments (in parameter order)."""

    __slots__ = ("kernel", "grid", "constexprs", "options", "compiled", "tail", "fast")

    def __init__(self, kernel, grid, constexprs: dict, options: dict, fast: bool):
        self.kernel, self.grid, self.constexprs, self.options = kernel, grid, constexprs, options
        self.compiled, self.tail, self.fast = None, None, fast

    def __call__(self, stream, *args):
        if self.compiled is not None:
            try:
                _direct(self.compiled, self.grid, stream, args + self.tail)
                return
            except Exception as exc:
                _STATE["ok"], _STATE["why"] = False, f"direct launch failed: {type(exc).__name__}: {exc}"
                self.compiled = None
                self.fast = False
        compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
        if self.fast and compiled is not None and _STATE.get("ok"):
            names = list(self.kernel.arg_names)
            if all(n in self.constexprs for n in names[len(args):]) and len(names) >= len(args):
                self.tail = tuple(self.constexprs[n] for n in names[len(args):])
                self.compiled = compiled


def status() -> str:
    return "on" if _STATE.get("ok") else f"off ({_STATE.get('why', 'not tried')})"
