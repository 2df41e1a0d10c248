"""Issue 35: GradientComparator.update's torch path against the fused one (grpo_conform/compare_fused.py)
on one CUDA GPU, per chunk of the judge (docs/checks.md, "Fused comparison on CUDA (opt-in)").

    PYTHONPATH=$PWD python3 benchmarks/compare_bench.py                      # the H200's judge chunks
    PYTHONPATH=$PWD python3 benchmarks/compare_bench.py --shapes 523x128256 --dtypes bfloat16 --reps 20
    for b in 256 512 1024; do for w in 4 8 16; do PYTHONPATH=$PWD python3 benchmarks/compare_bench.py \
        --shapes 523x128256 --dtypes bfloat16 --block $b --warps $w; done; done       # the kernel's launch
    PYTHONPATH=$PWD TRITON_INTERPRET=1 python3 benchmarks/compare_bench.py --device cpu --shapes 12x300 --reps 1

Default shapes: [523, 128256] (the reference's chunk on a GPU with a 2 GiB budget: 2^31 / (32 V) rows;
a judged call at logits [8, 1025, 128256] is 16 of them) and [2097, 32000]. Per shape and actual dtype,
a gradient-like chunk: expected = coef (onehot - softmax) in float64, actual = expected plus noise of
1e-5 of the row scale in the dtype, with the judge's arguments (floor, target patch, log-prob term).
Median of --reps calls after one warm-up, each timed alone (synchronized). Also says whether the two
paths agreed (counts, offenders, row sums; float sums within 1e-12 relative). `--device cpu` is a
smoke run of the code paths under TRITON_INTERPRET=1, not a measurement.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from grpo_conform import compare_fused
from grpo_conform.compare import TOP_K, GradientComparator
from grpo_conform.compare_fused import update_fused
from grpo_conform.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "specs" / "grpo-token-is.v1.json"


def make_chunk(rows: int, width: int, dtype: torch.dtype, device: str, seed: int = 0) -> tuple:
    g = torch.Generator(device=device).manual_seed(seed)
    f64 = dict(dtype=torch.float64, device=device)
    z = torch.randn(rows, width, generator=g, **f64) * 3
    cols = torch.randint(0, width, (rows,), generator=g, device=device)
    coef = torch.randn(rows, generator=g, **f64)
    expected = torch.softmax(z, dim=1).neg_()
    expected[torch.arange(rows, device=device), cols] += 1.0
    expected *= coef[:, None]
    del z
    scale = coef.abs() + 1e-3
    actual = (expected + 1e-5 * scale[:, None] * torch.randn(rows, width, generator=g, **f64)).to(dtype)
    floor = 1e-5 * scale
    target = (cols, 1e-4 * scale)
    logp = (coef, 1e-6 * coef.abs())
    return actual, expected, scale, floor, target, logp


def timed(fn, reps: int, device: str) -> float:
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    fn()  # warm-up (and the kernel's compilation)
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def agree(a: GradientComparator, b: GradientComparator) -> bool:
    same = all(getattr(a, f) == getattr(b, f) for f in ("elements", "mismatches", "nan", "inf", "row_sum_failures"))
    close = all(abs(getattr(a, f) - getattr(b, f)) <= 1e-12 * max(abs(getattr(a, f)), abs(getattr(b, f)))
                for f in ("diff_sq", "ref_sq", "atol_sq", "logp_sq"))
    worst = [o for _, o in a.worst] == [o for _, o in b.worst]
    return same and close and worst and a.worst_row_sum == b.worst_row_sum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["523x128256", "2097x32000"], help="ROWSxWIDTH of one chunk")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], help="the actual gradient's dtype")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seq-next", type=int, default=1025, help="positions per sequence (last rows are skipped)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--block", type=int, default=compare_fused.BLOCK, help="columns per step of the kernel")
    ap.add_argument("--warps", type=int, default=compare_fused.NUM_WARPS, help="warps per row")
    args = ap.parse_args()
    compare_fused.BLOCK, compare_fused.NUM_WARPS = args.block, args.warps
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("compare_bench: no CUDA device (use --device cpu with TRITON_INTERPRET=1 for a smoke run)")
    tol = load_spec(SPEC).tolerance("bfloat16").gradient
    print(f"block {args.block}, {args.warps} warps per row")
    print(f"{'chunk':>14} {'actual':>9} {'torch ms':>9} {'fused ms':>9} {'speedup':>8} {'agree':>6}  "
          f"{'torch GB/s':>10} {'fused GB/s':>10}")
    for shape in args.shapes:
        rows, width = (int(x) for x in shape.split("x"))
        for name in args.dtypes:
            dtype = getattr(torch, name)
            actual, expected, scale, floor, target, logp = make_chunk(rows, width, dtype, args.device)
            new = lambda: GradientComparator(tol, args.seq_next, width)  # noqa: E731
            ref_cmp, fused_cmp = new(), new()
            ref_cmp._update_torch(0, actual, expected, scale, floor, target, logp)
            update_fused(fused_cmp, 0, actual, expected, scale, floor, target, logp, top_k=TOP_K)
            ok = agree(ref_cmp, fused_cmp)
            t_torch = timed(lambda: new()._update_torch(0, actual, expected, scale, floor, target, logp),
                            args.reps, args.device)
            t_fused = timed(lambda: update_fused(new(), 0, actual, expected, scale, floor, target, logp, top_k=TOP_K),
                            args.reps, args.device)
            once = rows * width * (actual.element_size() + 8) / 1e9  # each input read once
            print(f"{shape:>14} {name:>9} {t_torch:9.2f} {t_fused:9.2f} {t_torch / t_fused:8.1f} {str(ok):>6}  "
                  f"{once / t_torch * 1e3:10.0f} {once / t_fused * 1e3:10.0f}")
            del actual, expected
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print(f"GB/s: rows x width x (actual's bytes + 8) / time, the traffic of reading each input once; "
          f"{math.ceil(8 * 1025 / 523)} chunks of 523x128256 make one judged call at [8, 1025, 128256].")


if __name__ == "__main__":
    main()
