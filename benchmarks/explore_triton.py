"""Explore launch settings of implementations/triton on one GPU (device tool), seed workloads.

Every variant computes the same function; each is checked against a float32 closed form before it
is timed (events on the current stream, L2 flushed, grpo_conform.timing.time_cuda). Ratios are
to the floor at this run's measured ceilings: forward = logits bytes / read bandwidth, full =
2 x logits bytes / copy bandwidth. Variants whose programs wait for each other (fused 'sync' with
more than one chunk per row) run one per process (--variant), so a deadlock costs only its timeout.

    python3 benchmarks/explore_triton.py --group safe --out results.json
    python3 benchmarks/explore_triton.py --variant sync:16384:16 --out results.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo_conform.hardware import measure_ceilings  # noqa: E402
from grpo_conform.timing import time_cuda  # noqa: E402

SEQ, VOCAB = 1024, 128256


def load_triton_impl():
    pkg = types.ModuleType("grpo_impl_triton")
    pkg.__path__ = [str(ROOT / "implementations" / "triton")]
    sys.modules["grpo_impl_triton"] = pkg
    return importlib.import_module("grpo_impl_triton.launch"), importlib.import_module("grpo_impl_triton.impl")


def inputs(batch: int):
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = (torch.randn(batch, SEQ + 1, VOCAB, device="cuda", generator=g) * 2).to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (batch, SEQ), device="cuda", generator=g)
    adv = torch.randn(batch, device="cuda", generator=g) + 0.5
    return x, ids, adv


def closed_form(x, ids, adv):
    b = x.shape[0]
    p = torch.softmax(x[:, :SEQ].float(), -1)
    p.scatter_add_(-1, ids.unsqueeze(-1), -torch.ones_like(p[..., :1]))
    return p.mul_(adv.view(b, 1, 1) / (b * SEQ))


def variants(group: str, base):
    if group == "forward":
        for chunk, warps in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16), (32768, 16)):
            yield f"forward:{chunk}:{warps}", replace(base, forward_chunk=chunk, forward_warps=warps)
    elif group == "safe":
        yield "two_sweep:8192:16", replace(base, fused="two_sweep", block=8192, num_warps=16)
        yield "two_sweep:8192:16:hints", replace(base, fused="two_sweep", block=8192, num_warps=16, hints=True)
        yield "persist1:16384:32:hints", replace(base, fused="two_sweep", block=16384, num_warps=32, hints=True,
                                                 persistent=True, programs_per_sm=1)
        yield "persist2:8192:16:hints", replace(base, fused="two_sweep", block=8192, num_warps=16, hints=True,
                                                persistent=True, programs_per_sm=2)


def parse_variant(text: str, base):
    kind, chunk, warps, *flags = text.split(":")
    return replace(base, fused="sync", chunk=int(chunk), num_warps=int(warps), stream_stores="plain" not in flags)


def measure(launch, impl, name, settings, batches, ceilings, results):
    for batch in batches:
        x, ids, adv = inputs(batch)
        prob = launch.Problem.of(x, 0.2, 0.2, 1.0)
        nbytes = x.numel() * x.element_size()
        row = {"variant": name, "batch": batch, "settings": asdict(settings)}
        try:
            if name.startswith("forward"):
                loss = launch.forward_loss(x, ids, adv, prob, settings)
                row["loss_err"] = abs(float(loss) + float(adv.float().mean()))
                t = time_cuda(lambda: launch.forward_loss(x, ids, adv, prob, settings), reps=20, warmup=3)
                floor = nbytes / ceilings.read_bytes_per_s * 1e9
            else:
                loss, grad, _ = launch.fused_loss_and_grad(x, ids, adv, prob, settings)
                ref = closed_form(x, ids, adv)
                row["grad_rel_err"] = float((grad[:, :SEQ].float() - ref).norm() / ref.norm())
                row["last_row_max"] = float(grad[:, SEQ].float().abs().max())
                row["loss_err"] = abs(float(loss) + float(adv.float().mean()))
                del ref, grad
                t = time_cuda(lambda: launch.fused_loss_and_grad(x, ids, adv, prob, settings), reps=20, warmup=3)
                floor = 2 * nbytes / ceilings.copy_bytes_per_s * 1e9
            t.sort()
            row.update(median_ms=t[len(t) // 2] / 1e6, p10_ms=t[2] / 1e6, p90_ms=t[-3] / 1e6,
                       floor_ms=floor / 1e6, ratio=t[len(t) // 2] / floor)
        except Exception as exc:  # a variant that fails to compile is a result too
            row["error"] = repr(exc)[:400]
        results.append(row)
        print(json.dumps(row), flush=True)
        del x, ids, adv
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", choices=["forward", "safe"])
    ap.add_argument("--variant", help="sync:CHUNK:WARPS[:plain]")
    ap.add_argument("--batches", default="2,4,8,16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    launch, impl = load_triton_impl()
    base = launch.GPU_DEFAULT
    ceilings = measure_ceilings("cuda")
    print(f"copy {ceilings.copy_bytes_per_s / 1e12:.3f} TB/s, read {ceilings.read_bytes_per_s / 1e12:.3f} TB/s",
          flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    results: list = []
    if args.variant:
        measure(launch, impl, args.variant, parse_variant(args.variant, base), batches, ceilings, results)
    else:
        for name, settings in variants(args.group, base):
            measure(launch, impl, name, settings, batches, ceilings, results)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(previous + results, indent=1))


if __name__ == "__main__":
    main()
