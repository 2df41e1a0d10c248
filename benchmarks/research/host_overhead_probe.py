"""Where the host time of one call goes at a launch-bound shape (issue 14): the current Triton
implementation's forward and full call, and the pieces they are made of (allocations, one
triton launch through `kernel[grid]` and through the compiled kernel's own launcher, an empty
autograd.Function, and the least any kernel implementation of the call must do: a fresh loss and a
fresh gradient, one launch in forward and one in backward). Wall time per call by
triton.testing.do_bench (back-to-back calls, median).

Run on the GPU machine from the repo root: python3 benchmarks/research/host_overhead_probe.py
"""
import importlib
import sys
import types
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]


def load_impl(name: str):
    pkg = types.ModuleType(f"impl_{name}")
    pkg.__path__ = [str(ROOT / "implementations" / name)]
    sys.modules[pkg.__name__] = pkg
    return importlib.import_module(f"{pkg.__name__}.impl")


@triton.jit
def _noop(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class _Id(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum()

    @staticmethod
    def backward(ctx, g):
        return g.expand(4)


class _Minimal(torch.autograd.Function):
    """The least any kernel implementation of this call does: a fresh loss and one launch in forward,
    a fresh gradient of the logits' shape and one launch in backward (compiled launchers, no checks)."""
    run = None

    @staticmethod
    def forward(ctx, logits, x):
        loss = torch.empty((), device=logits.device)
        _Minimal.run(x, 1024, 1024)
        ctx.shape = logits.shape
        ctx.x = x
        return loss

    @staticmethod
    def backward(ctx, g):
        grad = torch.empty(ctx.shape, device=g.device, dtype=torch.bfloat16)
        _Minimal.run(ctx.x, 1024, 1024)
        return grad, None


def row(label, fn):
    ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
    print(f"{label:60s} {ms * 1000:9.1f} us")


def main():
    dev = torch.device("cuda")
    b, s, v = 1, 16, 128256
    logits = torch.randn(b, s + 1, v, device=dev).to(torch.bfloat16)
    ids = torch.randint(0, v, (b, s), device=dev)
    adv = torch.randn(b, device=dev)
    x = torch.zeros(1024, device=dev)
    row("torch.empty x3", lambda: [torch.empty(16, device=dev) for _ in range(3)])
    row("torch.zeros(16)", lambda: torch.zeros(16, device=dev))
    row("triton kernel[grid](...)", lambda: _noop[(1,)](x, 1024, BLOCK=1024))
    compiled = _noop[(1,)](x, 1024, BLOCK=1024)
    try:
        runner = compiled[(1, 1, 1)]
        row("compiled[(1,1,1)](x, n, BLOCK)", lambda: runner(x, 1024, 1024))
    except Exception as e:  # the low-level API differs between versions
        print("compiled runner failed:", type(e).__name__, e)
    leaf = torch.zeros(4, device=dev, requires_grad=True)
    row("autograd.Function apply + backward (empty)", lambda: _Id.apply(leaf).backward())
    try:
        _Minimal.run = compiled[(1, 1, 1)]
        lm = torch.zeros(b, s + 1, v, device=dev, dtype=torch.bfloat16, requires_grad=True)

        def minimal():
            lm.grad = None
            _Minimal.apply(lm, x).backward()

        row("minimal op: 2 allocations + 2 launches, apply + backward", minimal)
    except Exception as e:
        print("minimal op failed:", type(e).__name__, e)
    impl = load_impl("triton")
    with torch.no_grad():
        row("ours: forward under no_grad", lambda: impl.grpo_loss(logits, ids, adv, 0.2, 0.2, 1.0))
    lg = logits.clone().requires_grad_(True)

    def full():
        lg.grad = None
        impl.grpo_loss(lg, ids, adv, 0.2, 0.2, 1.0).backward()

    row("ours: forward + backward", full)

    def full_scaled():
        lg.grad = None
        (impl.grpo_loss(lg, ids, adv, 0.2, 0.2, 1.0) * 0.25).backward()

    row("ours: forward + (0.25 * loss).backward()", full_scaled)
    try:
        from liger_kernel.ops.grpo_loss import GrpoLossFunction

        def liger_full():
            lg.grad = None
            GrpoLossFunction.apply(lg, None, None, ids, adv, None, 1.0, 0.0, 0.2, 0.2, False)[0].backward()

        row("liger: forward + backward", liger_full)
    except ImportError:
        print("liger not installed")
    import cProfile
    import pstats
    torch.cuda.synchronize()
    prof_py = cProfile.Profile()
    prof_py.enable()
    for _ in range(200):
        full()
    torch.cuda.synchronize()
    prof_py.disable()
    pstats.Stats(prof_py).sort_stats("tottime").print_stats(18)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            full()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages()]
    print("device kernels per full call:")
    for e in kernels:
        print(f"  {e.key[:70]:70s} count {e.count // 20:3d} x {e.device_time / max(1, e.count):7.2f} us")


if __name__ == "__main__":
    main()
