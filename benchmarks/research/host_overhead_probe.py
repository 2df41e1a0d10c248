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
    profile("token-is (seed call)", full)
    members(impl, lg)


def profile(label, full) -> None:
    """cProfile of 200 full calls (host), then the device kernels and the CPU-side ops of 20."""
    import cProfile
    import pstats
    print(f"\n== {label}")
    torch.cuda.synchronize()
    prof_py = cProfile.Profile()
    prof_py.enable()
    for _ in range(200):
        full()
    torch.cuda.synchronize()
    prof_py.disable()
    pstats.Stats(prof_py).sort_stats("tottime").print_stats(14)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            full()
        torch.cuda.synchronize()
    print("per full call (20 profiled): op, count, CPU us, device us")
    for e in sorted(prof.key_averages(), key=lambda e: -(e.self_cpu_time_total + e.self_device_time_total))[:25]:
        print(f"  {e.key[:60]:60s} {e.count / 20:5.1f} x cpu {e.self_cpu_time_total / max(1, e.count):7.2f}"
              f" dev {e.self_device_time_total / max(1, e.count):7.2f}")


def _member_calls(impl, sc, sp, shape, seed: int):
    """(member, kwargs, full call) for each of the sweep's members at `shape` (sweep_cuda's inputs)."""
    x, ids, adv, old, mask = sc.make_inputs(shape, seed=seed)
    leaf = x.detach().requires_grad_(True)
    for member in sp.MEMBERS:
        kw = sc.member_kwargs(member, ids, adv, old, mask)

        def full(kw=kw):
            leaf.grad = None
            impl.grpo_loss(leaf, **kw).backward()

        yield member, kw, full, mask, leaf


def members(impl, lg) -> None:
    """The sweep's launch-bound rows (sweep_cuda.member_kwargs: token-is, the masked token member, GSPO):
    why the masked member's full call took 0.318 ms against token-is's 0.136 on an H100 (2026-12-06)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sweep_cuda as sc
    import sweep_plan as sp
    shape = sp.Shape(vocab=lg.shape[-1], batch=lg.shape[0], seq=lg.shape[1] - 1, dtype="bfloat16")
    for member, kw, full, mask, leaf in _member_calls(impl, sc, sp, shape, 1):
        row(f"sweep {member}: forward + backward", full)
        for name, t in (("bool mask", mask.bool()), ("float mask", mask.float())):
            if "completion_mask" in kw:
                row(f"sweep {member}: forward + backward, {name}", lambda kw=dict(kw, completion_mask=t):
                    (setattr(leaf, "grad", None), impl.grpo_loss(leaf, **kw).backward()))
        profile(f"sweep {member}", full)
    # the masked member's deficit at V 32000 (1.14x its floor against token-is's 1.04x at b8 s1024 on an H100):
    # each kernel's device time, every member, bf16
    big = sp.Shape(vocab=32000, batch=8, seq=1024, dtype="bfloat16")
    first = True
    for member, _kw, full, mask, _leaf in _member_calls(impl, sc, sp, big, 2):
        if first:
            print(f"\n== V 32000 b8 s1024: kept tokens {int(mask.sum())} of {mask.numel()}")
            first = False
        row(f"V32000 b8 {member}: forward + backward", full)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                full()
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.self_device_time_total > 0:
                print(f"  {e.key[:60]:60s} {e.count / 10:5.1f} x dev {e.self_device_time_total / max(1, e.count):8.2f} us")


if __name__ == "__main__":
    main()
