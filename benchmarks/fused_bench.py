"""Issue 32's benchmark: implementations/triton-fused against the GEMMs it cannot avoid and its peers,
on one CUDA GPU, in one run (docs/fused-kernel.md).

    python3 benchmarks/fused_bench.py --out /tmp/fused_bench.json            # batches 2 and 8
    python3 benchmarks/fused_bench.py --batches 2 4 8 16 --chunks 1024 2048 4096 --strategies hold fp32

Seed shape T 1024, H 4096, V 128256, bf16 (flags change them). Per batch, for the full protocol
(forward + backward, d loss = 1) and forward-only (torch.no_grad):
  floor      the three cuBLAS GEMMs of the same shapes (forward: the logits GEMM alone)
  eager      torch: hidden @ weight.T, float32 log-softmax, the member's loss, autograd
  liger      LigerFusedLinearGRPOLoss (bf16; allow_tf32 as found, then True), if liger_kernel imports
  compose    cuBLAS logits + implementations/triton's logits kernel (unchunked; scores T - 1 tokens,
             the logits kernel's [B, T, V] contract), autograd through the GEMM
  ours[...]  implementations/triton-fused per chunk rows / weight-gradient strategy / logits dtype /
             programs per row (every combination of the list flags, plus --extra settings)
Median of --reps timed calls (CUDA events) after --warmup calls, L2 flushed (a 256 MiB write) before
each; peak extra memory = max_memory_allocated during one call minus what was allocated before it
(inputs); "net" also subtracts the returned gradients (hidden and weight in bf16). Correctness of
every ours[...] against the eager path in float32 (loss, and the gradients' relative Frobenius error)
at the first batch. Prints a table and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from fused_peers import MEMBERS, compose_loss, eager, liger_loss, load_folder, make_inputs, ours_loss, params_of

GIB = 2**30
DEVICE = "cuda"  # --device cpu: a smoke run of every code path at tiny shapes (TRITON_INTERPRET=1)


# -- timing -----------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, warmup, reps):
        self.warmup, self.reps = warmup, reps
        self.flush = torch.empty(256 * 2**20 if DEVICE == "cuda" else 16, dtype=torch.uint8, device=DEVICE)

    def __call__(self, fn, reset=None):
        for _ in range(self.warmup):
            if reset:
                reset()
            fn()
        times = []
        for _ in range(self.reps):
            if reset:
                reset()
            self.flush.zero_()
            if DEVICE != "cuda":
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
                continue
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        return statistics.median(times), times

    @staticmethod
    def peak(fn, reset=None):
        if reset:
            reset()
        if DEVICE != "cuda":
            fn()
            return 0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak


def leaves(x):
    return {k: x[k].detach().requires_grad_() for k in ("hidden", "weight")}


def full_step(loss_fn, lv):
    def run():
        loss = loss_fn(lv)
        loss.backward()
        return loss
    return run


def clear(lv):
    def reset():
        for t in lv.values():
            t.grad = None
    return reset


# -- the variants ----------------------------------------------------------------------------------------
def floor_fns(x):
    h = x["hidden"].reshape(-1, x["hidden"].shape[-1])
    w = x["weight"]
    n, v = h.shape[0], w.shape[0]
    logits = torch.empty(n, v, dtype=w.dtype, device=DEVICE)
    gh, gw = torch.empty_like(h), torch.empty_like(w)

    def forward():
        torch.mm(h, w.T, out=logits)

    def full():
        torch.mm(h, w.T, out=logits)
        torch.mm(logits, w, out=gh)
        torch.mm(logits.T, h, out=gw)
    return forward, full


INT_FIELDS = ("chunk_rows", "split_elems", "block", "num_warps", "forward_rows", "forward_block", "forward_stages")


def settings_list(args, S):
    out = []
    for chunk, strategy, logits, split in itertools.product(args.chunks, args.strategies, args.logits, args.split):
        out.append(S(chunk_rows=chunk, weight_grad=strategy, logits=logits, split_elems=split))
    for spec in args.extra:  # e.g. chunk=2048,weight_grad=auto,logits=float32
        kw = dict(item.split("=") for item in spec.split(","))
        kw = {k: (int(v) if k in INT_FIELDS else v) for k, v in kw.items()}
        out.append(S(**kw))
    return list(dict.fromkeys(out))


def label(s):
    acc = "" if s.accumulate == "auto" else f",{s.accumulate}"
    rows = "auto" if s.chunk_rows is None else s.chunk_rows  # None: the plan's choice (4096 under halves)
    fwd = "" if s.forward_rows is None else f",fwd{s.forward_rows}"
    if s.forward_sweep == "plain":  # the forward's sweep as every forward ran until 2026-12-03
        fwd += ",plain"
    elif s.forward_sweep == "pipelined":  # the forward's sweep from 2026-12-03 to 2026-12-05
        fwd += f",pipe{s.forward_block}x{s.forward_stages}"
    elif (s.forward_stage_bytes, s.forward_stage_block, s.forward_stage_warps) != (32768, 2048, 4):
        fwd += f",staged{s.forward_stage_bytes}/{s.forward_stage_block}/w{s.forward_stage_warps}"
    return f"ours[c{rows},{s.weight_grad}{acc},{s.logits},split{s.split_elems}{fwd}]"


def relerr(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def bench_batch(batch, args, timer, S, rows, check):
    x = make_inputs(batch, args.seq, args.hidden, args.vocab, args.member, DEVICE)
    p = params_of(args.member, args.seq)
    grads_bytes = x["hidden"].numel() * 2 + x["weight"].numel() * 2
    n, h, v = batch * args.seq, args.hidden, args.vocab
    flops = 2.0 * n * h * v

    def record(name, protocol, fn, reset=None, note=""):
        try:
            ms, times = timer(fn, reset)
            peak = Timer.peak(fn, reset)
        except torch.cuda.OutOfMemoryError as exc:
            rows.append(dict(batch=batch, variant=name, protocol=protocol, error=f"out of memory: {exc}"[:200]))
            torch.cuda.empty_cache()
            return
        except Exception as exc:  # a peer that fails is reported, the run goes on
            rows.append(dict(batch=batch, variant=name, protocol=protocol, error=f"{type(exc).__name__}: {exc}"[:300]))
            return
        net = peak - (grads_bytes if protocol == "full" else 0)
        rows.append(dict(batch=batch, variant=name, protocol=protocol, ms=ms, times=times, peak_extra_gib=peak / GIB,
                         net_extra_gib=net / GIB, note=note))
        print(f"  b{batch} {protocol:8s} {name:42s} {ms:9.3f} ms  +{peak / GIB:6.2f} GiB (net {net / GIB:+6.2f}) {note}",
              flush=True)

    fwd, full = floor_fns(x)
    record("floor (cuBLAS GEMMs)", "forward", fwd, note=f"{flops / 1e12:.1f} TFLOP")
    record("floor (cuBLAS GEMMs)", "full", full, note=f"{3 * flops / 1e12:.1f} TFLOP")
    del fwd, full
    torch.cuda.empty_cache()

    variants = [("eager", lambda lv: eager({**x, **lv}, p))]
    if args.liger:
        try:
            variants.append(("liger", liger_loss(x, p, args.member)))
        except ImportError as exc:
            print(f"  Liger not measured: {exc}", flush=True)
            rows.append(dict(batch=batch, variant="liger", protocol="-", error=f"not installed: {exc}"))
    variants.append(("compose (cuBLAS + triton logits kernel)", compose_loss(x, p)))
    ours = []
    for s in settings_list(args, S):
        fn, impl = ours_loss(x, p, s)
        variants.append((label(s), fn))
        ours.append((label(s), fn, s, impl))

    for name, loss_fn in variants:
        lv = leaves(x)
        tf32_modes = (None, True) if name == "liger" else (None,)
        for tf32 in tf32_modes:
            before = torch.backends.cuda.matmul.allow_tf32
            if tf32 is not None:
                torch.backends.cuda.matmul.allow_tf32 = tf32
            tag = name if tf32 is None else f"{name} (allow_tf32)"
            try:
                record(tag, "full", full_step(loss_fn, lv), clear(lv))

                def forward_only(loss_fn=loss_fn, lv=lv):
                    with torch.no_grad():
                        return loss_fn(lv)
                record(tag, "forward", forward_only)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
        del lv
        torch.cuda.empty_cache()

    if check:  # ours against eager in float32 (one call each)
        lv = leaves(x)
        ref_lv = {k: t.detach().float().requires_grad_() for k, t in lv.items()}
        ref = eager({**x, **ref_lv}, p, fp32=True)
        ref.backward()
        for name, fn, s, impl in ours:
            lv2 = leaves(x)
            loss = fn(lv2)
            loss.backward()
            plan = next((pl for pl in impl._PLANS.values() if pl.settings == s and pl.tokens == n), None)
            info = dict(batch=batch, variant=name, protocol="check", loss=float(loss), ref_loss=float(ref),
                        loss_rel=abs(float(loss) - float(ref)) / max(1e-30, abs(float(ref))),
                        hidden_rel=relerr(lv2["hidden"].grad, ref_lv["hidden"].grad),
                        weight_rel=relerr(lv2["weight"].grad, ref_lv["weight"].grad),
                        strategy=None if plan is None else plan.weight_grad,
                        accumulate_path=None if plan is None else plan.accumulate_path)
            rows.append(info)
            print(f"  check {name:42s} loss {info['loss_rel']:.2e}  d hidden {info['hidden_rel']:.2e}  "
                  f"d weight {info['weight_rel']:.2e}  strategy {info['strategy']} ({info['accumulate_path']})", flush=True)
            del lv2
        del lv, ref_lv, ref
        torch.cuda.empty_cache()
    del x


def table(rows) -> str:
    floors = {(r["batch"], r["protocol"]): r["ms"] for r in rows if r["variant"].startswith("floor") and "ms" in r}
    lines = ["| batch | protocol | variant | ms | x floor | peak extra GiB | net GiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["protocol"] not in ("full", "forward"):
            continue
        if "error" in r:
            lines.append(f"| {r['batch']} | {r['protocol']} | {r['variant']} | {r['error'][:60]} | | | |")
            continue
        f = floors.get((r["batch"], r["protocol"]))
        ratio = f"{r['ms'] / f:.3f}" if f else ""
        lines.append(f"| {r['batch']} | {r['protocol']} | {r['variant']} | {r['ms']:.3f} | {ratio} | "
                     f"{r['peak_extra_gib']:.2f} | {r['net_extra_gib']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--member", choices=sorted(MEMBERS), default="offpolicy-mask")
    ap.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096], help="ours: rows per chunk")
    ap.add_argument("--strategies", nargs="+", default=["hold", "fp32"], choices=["auto", "hold", "halves", "fp32"])
    ap.add_argument("--logits", nargs="+", default=["weight"], choices=["weight", "float32"])
    ap.add_argument("--split", type=int, nargs="+", default=[16384], help="ours: elements per program (0: a row each)")
    ap.add_argument("--extra", nargs="*", default=["weight_grad=auto",  # the shipped defaults
                                                    "chunk_rows=2048,weight_grad=auto,logits=float32",
                                                    "chunk_rows=2048,weight_grad=auto,split_elems=0",
                                                    "chunk_rows=2048,weight_grad=fp32,accumulate=triton"],
                    help="more ours settings, key=value,...")
    ap.add_argument("--no-liger", dest="liger", action="store_false")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of the code paths (tiny shapes, TRITON_INTERPRET=1), no meaningful numbers")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("fused_bench.py needs a CUDA GPU (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    S = importlib.import_module(load_folder("triton-fused", "fused_bench_ours").__name__ + ".semantics").FusedSettings
    timer = Timer(args.warmup, args.reps)
    rows: list[dict] = []
    started = time.time()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"{name} torch {torch.__version__}; T {args.seq} H {args.hidden} V {args.vocab} "
          f"member {args.member}; allow_tf32 {torch.backends.cuda.matmul.allow_tf32}", flush=True)
    for i, batch in enumerate(args.batches):
        bench_batch(batch, args, timer, S, rows, check=i == 0)
    text = table(rows)
    print(text)
    print(f"total {time.time() - started:.0f} s")
    if args.out:
        meta = dict(device=name, torch=torch.__version__,
                    triton=importlib.import_module("triton").__version__, args=vars(args),
                    seconds=time.time() - started)
        try:
            from importlib.metadata import version
            meta["liger"] = version("liger-kernel")
        except Exception:
            meta["liger"] = None
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
