"""Does the GEMM ceiling's time depend on its operands' values? (docs/fused-kernel.md, "Round 32x on the H200")

The validator times an implementation on the workload's drawn inputs, and the cuBLAS ceiling beside it on
`gemm_ceiling._operands`'s draw (N(0, 1) x 0.02 in the operands' dtype; since the twenty-fourth session the
ceiling takes the timed inputs' own values where an input holds the operand, after this script's H100 run).
A GPU's clock under a tensor-core load follows its power draw, which follows the bits the multipliers
toggle, so the same GEMM can take longer on some values than on others. This times `torch.mm(hidden, weight.T)` at a seed workload on:
- the ceiling's operands;
- the workload's own draw (the conformance generator, as the timed run's buffer sets start);
- fused_profile's inputs (hidden N(0, 4), weight N(0, 1/H));
- zeros (the lower bound of the effect),
interleaved over rounds, with `grpo_conform.timing.time_cuda` (L2 flushed, spin before the start event).

    python3 benchmarks/research/gemm_operands.py --workload seed-b2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grpo_conform.gemm_ceiling import _operands  # noqa: E402
from grpo_conform.ops import operation_for  # noqa: E402
from grpo_conform.ops.interface import Gemm  # noqa: E402
from grpo_conform.spec import load_family  # noqa: E402
from grpo_conform.timing import time_cuda  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="seed-b2")
    ap.add_argument("--member", default="token-offpolicy-mask")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device("cuda")
    spec = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json").member(a.member)
    rw = spec.resolve(spec.workload(a.workload))
    x = operation_for(spec).generate(spec, rw, 12345, dev)
    hidden, weight = x["hidden"].reshape(-1, x["hidden"].shape[-1]), x["weight"]
    n, h = hidden.shape
    v = weight.shape[0]
    (ceil_a, ceil_b), _ = _operands(Gemm(n, h, v, "bfloat16", "logits = hidden weight^T", "b"), dev)  # drawn
    g = torch.Generator(device=dev).manual_seed(1)
    prof_h = (torch.randn(n, h, device=dev, generator=g) * 2).to(torch.bfloat16)
    prof_w = (torch.randn(v, h, device=dev, generator=g) / h ** 0.5).to(torch.bfloat16)
    out = torch.empty(n, v, dtype=torch.bfloat16, device=dev)
    sets = {"ceiling operands": (ceil_a, ceil_b), "workload draw": (hidden, weight.t()),
            "fused_profile inputs": (prof_h, prof_w.t()), "zeros": (torch.zeros_like(hidden), torch.zeros_like(weight).t())}
    stats = {name: {"absmax": [float(t.abs().max()) for t in pair], "std": [float(t.float().std()) for t in pair]}
             for name, pair in sets.items() if name != "zeros"}
    times: dict[str, list[float]] = {k: [] for k in sets}
    for _ in range(a.rounds):
        for name, (left, right) in sets.items():
            ns = time_cuda(lambda: torch.mm(left, right, out=out), a.reps, 3)
            times[name].append(statistics.median(ns) / 1e6)
    base = statistics.median(times["ceiling operands"])
    print(f"{torch.cuda.get_device_name()}, {a.member} {a.workload}: torch.mm [{n}, {h}] x [{h}, {v}]")
    for name, t in times.items():
        m = statistics.median(t)
        print(f"  {name:22s} {m:7.3f} ms  ({m / base:.3f}x the ceiling's operands; rounds {', '.join(f'{x:.3f}' for x in t)})")
    print("  operand scales:", json.dumps(stats))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "workload": a.workload, "times_ms": times, "stats": stats}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
