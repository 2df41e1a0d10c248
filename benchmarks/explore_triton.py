"""Explore launch settings of implementations/triton on one GPU (device tool), seed workloads.

Every variant computes the same function; each is checked against a float32 closed form before it
is timed (events on the current stream, L2 flushed, grpo_conform.timing.time_cuda). Ratios are
to the floor at this run's measured ceilings: forward = logits bytes / read bandwidth, full =
2 x logits bytes / copy bandwidth. Variants whose programs wait for each other (fused 'sync' with
more than one chunk per row) run one per process (--variant), so a deadlock costs only its timeout.

    python3 benchmarks/explore_triton.py --group safe --out results.json
    python3 benchmarks/explore_triton.py --variant split:chunk=16384,block=4096,num_warps=4 --out results.json
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


GROUPS = {
    "safe3": [
        "two_sweep:block=8192,num_warps=16,vector=1",
        "two_sweep:block=4096,num_warps=8,vector=1",
        "two_sweep:block=16384,num_warps=32,persistent=1,vector=1",
    ],
    "forward3": [
        "forward:forward_chunk=32768,forward_block=4096,forward_warps=4,forward_stages=3,forward_vector=1",
        "forward:forward_chunk=131072,forward_block=8192,forward_warps=8,forward_vector=1",
        "forward:forward_chunk=16384,forward_block=4096,forward_warps=4,forward_vector=1",
        "forward:forward_chunk=65536,forward_block=4096,forward_warps=4,forward_vector=1",
        "forward:forward_chunk=131072,forward_block=2048,forward_warps=4,forward_vector=1",
    ],
    "forward4": [
        "forward:forward_chunk=0,forward_block=2048,forward_warps=1,forward_vector=0,forward_programs=16384",
        "forward:forward_chunk=0,forward_block=2048,forward_warps=1,forward_vector=0,forward_programs=32768",
        "forward:forward_chunk=0,forward_block=2048,forward_warps=1,forward_vector=0,forward_programs=65536",
        "forward:forward_chunk=0,forward_block=1024,forward_warps=1,forward_vector=0,forward_programs=131072",
        "forward:forward_chunk=0,forward_block=2048,forward_warps=2,forward_vector=0,forward_programs=65536",
    ],
    "forward6": [
        "forward:forward_chunk=0,forward_block=2048,forward_warps=1,forward_vector=0,forward_programs=16384",
        "forward:forward_stage_bytes=16384,forward_block=2048,forward_warps=4",
        "forward:forward_stage_bytes=8192,forward_block=2048,forward_warps=4",
        "forward:forward_stage_bytes=16384,forward_block=1024,forward_warps=2",
        "forward:forward_stage_bytes=32768,forward_block=2048,forward_warps=4",
        "forward:forward_stage_bytes=16384,forward_block=4096,forward_warps=4",
    ],
    "forward5": [
        "forward:forward_chunk=0,forward_block=2048,forward_warps=1,forward_vector=0,forward_programs=8192",
        "forward:forward_chunk=0,forward_block=2048,forward_warps=1,forward_vector=0,forward_programs=4096",
        "forward:forward_stage_bytes=8192,forward_block=1024,forward_warps=1",
        "forward:forward_stage_bytes=16384,forward_block=1024,forward_warps=1",
        "forward:forward_stage_bytes=32768,forward_block=2048,forward_warps=2",
        "forward:forward_stage_bytes=16384,forward_block=2048,forward_warps=4",
        "forward:forward_stage_bytes=65536,forward_block=4096,forward_warps=4",
    ],
    # no program waits for another: safe to run many in one process
    "safe": [
        "two_sweep:block=8192,num_warps=16",
        "two_sweep:block=16384,num_warps=32,persistent=1",
        "two_sweep:block=8192,num_warps=16,persistent=1,num_stages=3",
        "two_sweep:block=16384,num_warps=16,persistent=1,num_stages=2",
        "two_sweep:block=8192,num_warps=8,persistent=1,programs_per_sm=2,num_stages=3",
    ],
    "forward": [
        "forward:forward_chunk=8192,forward_block=8192,forward_warps=4",
        "forward:forward_chunk=32768,forward_block=8192,forward_warps=4",
        "forward:forward_chunk=131072,forward_block=8192,forward_warps=8",
        "forward:forward_chunk=131072,forward_block=4096,forward_warps=4,forward_stages=3",
        "forward:forward_chunk=16384,forward_block=4096,forward_warps=4,forward_stages=2",
        "forward:forward_chunk=32768,forward_block=4096,forward_warps=4,forward_stages=3",
    ],
}


def parse(text: str, base):
    """'kind:key=value,...' -> (name, KernelSettings); kind is a fused variant or 'forward'."""
    kind, _, rest = text.partition(":")
    fields = {}
    for item in filter(None, rest.split(",")):
        key, value = item.split("=")
        current = getattr(base, key)
        fields[key] = bool(int(value)) if isinstance(current, bool) else type(current)(value)
    if kind != "forward":
        fields["fused"] = kind
    return text, replace(base, **fields)


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


def shipped(impl, batches, ceilings, results) -> None:
    """The entry as the validator calls it: forward under no_grad, and forward + backward."""
    for batch in batches:
        x, ids, adv = inputs(batch)
        nbytes = x.numel() * x.element_size()

        def full():
            leaf = x.detach().requires_grad_()
            impl.grpo_loss(leaf, ids, adv, 0.2, 0.2, 1.0).backward()

        def forward():
            with torch.no_grad():
                impl.grpo_loss(x, ids, adv, 0.2, 0.2, 1.0)

        # What a plain read of the same bytes costs at this size (torch's own reduction), after an
        # L2 flush that leaves dirty lines behind and after one that leaves clean lines.
        for clean in (False, True):
            t = sorted(time_cuda(lambda: x.sum(dtype=torch.float32), reps=20, warmup=3, clean=clean))
            row = {"variant": f"torch-sum-read/{'clean' if clean else 'dirty'}-flush", "batch": batch,
                   "median_ms": t[10] / 1e6, "ratio": t[10] / (nbytes / ceilings.read_bytes_per_s * 1e9)}
            results.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        full()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        for name, fn, floor in (("shipped-full", full, 2 * nbytes / ceilings.copy_bytes_per_s * 1e9),
                                ("shipped-forward", forward, nbytes / ceilings.read_bytes_per_s * 1e9)):
            t = sorted(time_cuda(fn, reps=20, warmup=3))
            row = {"variant": name, "batch": batch, "median_ms": t[10] / 1e6, "floor_ms": floor / 1e6,
                   "ratio": t[10] / floor, "peak_extra_over_grad": peak / nbytes}
            results.append(row)
            print(json.dumps(row), flush=True)
        del x, ids, adv
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", choices=sorted(GROUPS))
    ap.add_argument("--variant", help="one variant, e.g. split:chunk=16384,block=4096,num_warps=4")
    ap.add_argument("--autograd", action="store_true", help="also time impl.grpo_loss + backward as shipped")
    ap.add_argument("--batches", default="2,4,8,16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    launch, impl = load_triton_impl()
    base = launch.KernelSettings()  # class defaults, not the shipped choice: variants say what they change
    ceilings = measure_ceilings("cuda")
    print(f"copy {ceilings.copy_bytes_per_s / 1e12:.3f} TB/s, read {ceilings.read_bytes_per_s / 1e12:.3f} TB/s",
          flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    results: list = []
    texts = [args.variant] if args.variant else GROUPS.get(args.group, [])
    for text in texts:
        name, settings = parse(text, base)
        measure(launch, impl, name, settings, batches, ceilings, results)
    if args.autograd:
        shipped(impl, batches, ceilings, results)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(previous + results, indent=1))


if __name__ == "__main__":
    main()
