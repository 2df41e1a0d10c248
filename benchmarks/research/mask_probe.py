"""Round 10 of docs/triton-kernel-notes.md on one GPU (device tool): where the masked members' time
goes, and what the fixed cost of a small call is.

Sections (`--only`, comma-separated):
- `ceilings`: copy, read and write-only (memset) bandwidth over 4 GB buffers;
- `small`: torch's own copy_ of a seed-b2 and a seed-b16 sized logits tensor, as ratios to the
  copy floor at those ceilings: the ramp and tail every kernel of that size pays (issue 14's
  batch-2 target is a ratio to the same floor);
- `mask`: token-offpolicy-mask at batch 8, forward + loss.backward() (c = 1), for right-padded
  masks of several unmasked fractions, with the grid in sequence order and interleaved by position
  (staged_members.INTERLEAVE_MASKED; sequence order is shipped); the two orders' gradients must be identical;
- `validator`: the same call on the validator's own mask-b8 inputs (grpo_conform.ops.grpo_logits.inputs.generate),
  then with an int64 mask and with plain randn logits, to find which input moves the time.

Device time: grpo_conform.timing.time_cuda (CUDA events, clean L2 flush, the validator's adaptive
pre-start spin). Prints JSON lines and a table; writes $OUT/mask_probe.json.

    python3 benchmarks/research/mask_probe.py [--only ceilings,small,mask,validator] [--reps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_v3 as kv  # noqa: E402  (inputs, timers and the package loader of round 9)

from grpo_conform.hardware import measure_ceilings  # noqa: E402
from grpo_conform.timing import time_cuda  # noqa: E402

FRACTIONS = (1.0, 0.8, 0.65, 0.5, 0.25, 0.0)


def write_ceiling(reps: int) -> float:
    buf = torch.empty(2 * 1024**3, dtype=torch.bfloat16, device="cuda")
    ns = time_cuda(lambda: buf.zero_(), reps=reps, warmup=3)
    rate = buf.numel() * 2 / (kv.median_ms(ns) / 1e3)
    del buf
    torch.cuda.empty_cache()
    return rate


def small_copies(ceil, reps: int) -> None:
    for batch in (2, 16):
        src = torch.empty(batch, kv.SEQ + 1, kv.VOCAB, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        dst = torch.empty_like(src)
        floor = 2 * src.numel() * 2 / ceil.copy_bytes_per_s * 1e3
        ms = kv.median_ms(time_cuda(lambda: dst.copy_(src), reps=reps, warmup=3))
        kv.emit(kind="torch-copy", batch=batch, ms=ms, floor_ms=floor, ratio=ms / floor)
        del src, dst
        torch.cuda.empty_cache()


def masked_floor_ms(x: torch.Tensor, unmasked: int, ceil) -> float:
    """traffic-v1's full-call floor for a masked member, logits terms only: the unmasked rows read, every
    row's gradient written, all at the copy rate (as many bytes written as read or more)."""
    batch, seq_next, vocab = x.shape
    return (unmasked + batch * seq_next) * vocab * x.element_size() / ceil.copy_bytes_per_s * 1e3


def padded_mask(batch: int, seq: int, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """Right padding, lengths spread +-25% of seq around `fraction` (clamped), mean close to it."""
    centre = fraction * seq
    spread = min(centre, seq - centre, 0.25 * seq)
    lens = (centre + (torch.rand(batch, device="cuda", generator=gen) * 2 - 1) * spread).round().long()
    return (torch.arange(seq, device="cuda")[None] < lens[:, None]).to(torch.int64).contiguous()


def mask_rounds(impl, staged_members, ceil, reps: int) -> None:
    x, ids, adv, old, _ref, _mask = kv.member_inputs()
    batch, seq_next, _vocab = x.shape
    gen = torch.Generator(device="cuda").manual_seed(7)
    shipped = staged_members.INTERLEAVE_MASKED
    leaf = x.detach().requires_grad_(True)
    for fraction in FRACTIONS:
        mask = padded_mask(batch, seq_next - 1, fraction, gen)
        unmasked = int(mask.sum())
        floor = masked_floor_ms(x, unmasked, ceil)
        kw = dict(completion_ids=ids, advantages=adv, old_logprobs=old, completion_mask=mask, epsilon_low=0.2,
                  epsilon_high=0.28, temperature=1.0, loss_type="grpo")
        grads = {}
        for interleave in (False, True):  # the grid's two orders (staged_members.INTERLEAVE_MASKED)
            staged_members.INTERLEAVE_MASKED = interleave
            impl._PLANS.clear()  # the switch is read when a plan builds its launch
            ms = kv.time_full(impl.grpo_loss, leaf, kw, "1", reps)
            leaf.grad = None
            impl.grpo_loss(logits=leaf, **kw).backward()
            grads[interleave] = leaf.grad.clone()
            kv.emit(kind="mask-full", interleave=interleave, fraction=unmasked / (batch * (seq_next - 1)), ms=ms,
                    floor_ms=floor, ratio=ms / floor)
        kv.emit(kind="mask-identical", fraction=fraction, identical=torch.equal(grads[False], grads[True]))
        del grads
    staged_members.INTERLEAVE_MASKED = shipped  # back to the shipped order
    impl._PLANS.clear()
    del x, leaf
    torch.cuda.empty_cache()


def validator_inputs(impl, ceil, reps: int) -> None:
    """token-offpolicy-mask at mask-b8 with the validator's own inputs (grpo_conform.ops.grpo_logits.inputs.generate), timed
    in this process as above: is the validator's slower masked time (round 9) in its inputs or its path?"""
    from grpo_conform.ops.grpo_logits.inputs import generate
    from grpo_conform.spec import load_member

    spec = load_member(str(Path(__file__).resolve().parents[2] / "specs" / "grpo.v1.json"), "token-offpolicy-mask")
    rw = spec.resolve(spec.workload("mask-b8"))
    for seed in (11, 12):
        t = generate(spec, rw, seed=seed, device="cuda").tensors
        x = t.pop("logits")
        batch, seq_next, _vocab = x.shape
        unmasked = int((t["completion_mask"] != 0).sum())
        floor = masked_floor_ms(x, unmasked, ceil)
        leaf = x.detach().requires_grad_(True)
        kw = dict(t, **spec.parameter_values)
        ms = kv.time_full(impl.grpo_loss, leaf, kw, "1", reps)
        kv.emit(kind="validator-inputs-full", seed=seed, fraction=unmasked / (batch * (seq_next - 1)), ms=ms,
                floor_ms=floor, ratio=ms / floor, dtypes={k: str(v.dtype) for k, v in t.items()})
        # the same call with the mask as int64 and the probe's own logits: which input moves the time
        kw64 = dict(kw, completion_mask=t["completion_mask"].to(torch.int64))
        ms64 = kv.time_full(impl.grpo_loss, leaf, kw64, "1", reps)
        kv.emit(kind="validator-inputs-int64-mask", seed=seed, ms=ms64, floor_ms=floor, ratio=ms64 / floor)
        g = torch.Generator(device="cuda").manual_seed(seed)
        plain = (torch.randn(x.shape, device="cuda", generator=g) * 2).to(x.dtype).requires_grad_(True)
        msp = kv.time_full(impl.grpo_loss, plain, kw, "1", reps)
        kv.emit(kind="validator-inputs-randn-logits", seed=seed, ms=msp, floor_ms=floor, ratio=msp / floor)
        del x, leaf, plain, t
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="ceilings,small,mask,validator")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    only = set(args.only.split(","))
    impl, _plan, staged_members, _fast = kv.load()
    ceil = measure_ceilings("cuda")
    kv.emit(kind="ceilings", copy=ceil.copy_bytes_per_s, read=ceil.read_bytes_per_s,
            write=write_ceiling(args.reps) if "ceilings" in only else None)
    if "small" in only:
        small_copies(ceil, args.reps)
    if "mask" in only:
        mask_rounds(impl, staged_members, ceil, args.reps)
    if "validator" in only:
        validator_inputs(impl, ceil, args.reps)
    print("\nkind | case | ms | floor ms | x floor")
    for r in kv.ROWS:
        if "ms" in r:
            case = {k: v for k, v in r.items() if k in ("batch", "seed", "interleave", "fraction")}
            print(f"{r['kind']} | {case} | {r['ms']:.4f} | {r['floor_ms']:.4f} | {r['ratio']:.3f}")
        else:
            print(r)
    out = os.environ.get("OUT")
    if out:
        Path(out, "mask_probe.json").write_text(json.dumps(kv.ROWS, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
