"""Where a forward-only call of implementations/triton-fused spends its time beyond the logits GEMM (issue 32's
b2 forward, docs/fused-kernel.md "Round 32"), kernel by kernel, under the validator's timing conditions.

    python3 benchmarks/fused_profile.py --batches 2 4 --reps 10 --out /tmp/fused_profile.json

Each timed call runs as the validator times one: the L2 flushed (a 256 MiB write), then a spin on the GPU
(torch.cuda._sleep, ~1 ms) while the host enqueues the whole call, and a short spin after it marks its end, so host launch latency stays off the
GPU's timeline unless the call waits on the device itself. torch.profiler records every kernel. Per call:
`span` is from the first kernel after the spin to the last kernel's end; `kernels` the sum of their
durations; `gaps` the difference (idle GPU inside the call: a synchronisation or an allocation that waits
on the device); `gemm` the logits GEMM's own duration (ours up to 4096 rows: the epilogue GEMM, which makes the
row statistics too). Variants: ours as shipped (the epilogue GEMM up to 4096 rows, epilogue.py), ours through
cuBLAS with the staged sweep and with the pipelined sweep, compose (cuBLAS, then implementations/triton's forward), and the bare
GEMM, into a fresh output and into a kept one (`out=`). Medians over --reps calls; the slowest non-GEMM
kernels of ours are listed by name. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from fused_peers import compose_loss, eager, load_folder, make_inputs, ours_loss, params_of

SPIN_CYCLES = 2_000_000  # ~1 ms at the H200's clock: longer than enqueueing any variant's kernels


def _kernels(prof) -> list:
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.time_range.start, e.time_range.end, e.name))
    return sorted(out)


def _calls(kernels, spin_name: str) -> list[list]:
    """The kernels of each timed call: those between a long spin (before the call) and the short one after
    it (both torch.cuda._sleep kernels, told apart by duration)."""
    spins = [e - s for s, e, n in kernels if spin_name in n]
    long_spin = 0.5 * max(spins, default=0.0)
    calls, current = [], None
    for start, end, name in kernels:
        if spin_name in name:
            current = [] if end - start >= long_spin else None
            if current is not None:
                calls.append(current)
        elif current is not None:
            current.append((start, end, name))
    return [c for c in calls if c]


def _is_gemm(name: str) -> bool:
    n = name.lower()
    return any(k in n for k in ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas"))


def profile(fn, reps: int, flush: torch.Tensor) -> dict:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            flush.fill_(i)
            torch.cuda._sleep(SPIN_CYCLES)
            fn()
            torch.cuda._sleep(SPIN_CYCLES // 20)  # the call's end on the GPU's timeline
            torch.cuda.synchronize()
    kernels = _kernels(prof)
    spin = next((n for _, _, n in kernels if "sleep" in n.lower() or "spin" in n.lower()), "sleep")
    rows = []
    names: dict[str, list[float]] = {}
    for call in _calls(kernels, spin):
        span = call[-1][1] - call[0][0]
        busy = sum(e - s for s, e, _ in call)
        gemm = sum(e - s for s, e, n in call if _is_gemm(n))
        rows.append((span, busy, gemm))
        for s, e, n in call:
            if not _is_gemm(n):
                names.setdefault(n[:60], []).append(e - s)
    med = lambda i: statistics.median(r[i] for r in rows) if rows else float("nan")  # noqa: E731
    top = sorted(((statistics.median(v), len(v) / max(1, len(rows)), k) for k, v in names.items()), reverse=True)[:6]
    return {"calls": len(rows), "span_us": med(0), "kernels_us": med(1), "gaps_us": med(0) - med(1),
            "gemm_us": med(2), "top": [{"name": k, "median_us": m, "per_call": c} for m, c, k in top]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[2])
    ap.add_argument("--member", default="offpolicy-mask")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rotate", type=int, default=1, help="also time ours and the GEMM over this many input sets "
                    "in turn, as the validator's timing rotates its buffer sets (1: off)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_profile: CUDA only", file=sys.stderr)
        return 2
    pkg = load_folder("triton-fused", "fused_bench_ours")
    settings = __import__(pkg.__name__ + ".semantics", fromlist=["FusedSettings"]).FusedSettings
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    results = {}
    for batch in args.batches:
        x = make_inputs(batch, 1024, 4096, 128256, args.member, "cuda")
        p = params_of(args.member, 1024)
        lv = {"hidden": x["hidden"], "weight": x["weight"]}
        kept = torch.empty(batch * 1024, 128256, dtype=torch.bfloat16, device="cuda")
        h2 = x["hidden"].view(-1, 4096)
        variants = {
            "gemm (fresh output)": lambda: torch.mm(h2, x["weight"].t()),
            "gemm (out=, kept)": lambda o=kept: torch.mm(h2, x["weight"].t(), out=o),
            "compose": lambda f=compose_loss(x, p): f(lv),
            "ours (epilogue)": lambda f=ours_loss(x, p, settings())[0]: f(lv),  # the default up to 4096 rows
            "ours (staged)": lambda f=ours_loss(x, p, settings(forward_gemm="cublas"))[0]: f(lv),
            "ours (pipelined)": lambda f=ours_loss(x, p, settings(forward_sweep="pipelined", forward_gemm="cublas"))[0]:
                f(lv),
        }
        with torch.no_grad():
            got, want = float(ours_loss(x, p, settings())[0](lv)), float(eager(x, p, fp32=True))
        print(f"b{batch} ours (default settings) loss {got:.7g} against eager float32 {want:.7g} "
              f"(|diff| {abs(got - want):.2e})")
        if args.rotate > 1:  # the validator's timing: fresh inputs every call, over buffer sets in turn
            sets = [x] + [make_inputs(batch, 1024, 4096, 128256, args.member, "cuda", seed=k) for k in range(1, args.rotate)]
            losses = [ours_loss(xs, p, settings())[0] for xs in sets]
            turn = iter(range(1 << 30))
            variants[f"gemm, {args.rotate} sets"] = lambda: (
                lambda xs: torch.mm(xs["hidden"].view(-1, 4096), xs["weight"].t()))(sets[next(turn) % len(sets)])
            variants[f"ours (staged), {args.rotate} sets"] = lambda: (
                lambda k: losses[k]({"hidden": sets[k]["hidden"], "weight": sets[k]["weight"]}))(next(turn) % len(sets))
        with torch.no_grad():
            for name, fn in variants.items():
                r = results[f"b{batch} {name}"] = profile(fn, args.reps, flush)
                print(f"b{batch} {name:22s} span {r['span_us']:8.1f} us  kernels {r['kernels_us']:8.1f}  "
                      f"gaps {r['gaps_us']:6.1f}  gemm {r['gemm_us']:8.1f}  ({r['calls']} calls)", flush=True)
                for t in r["top"] if name.startswith("ours") else ():
                    print(f"      {t['median_us']:7.1f} us x{t['per_call']:.0f}  {t['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
