"""Issue 36's shape sweep on one CUDA GPU: our logits-level GRPO kernel (implementations/triton) against
the DRAM floor and Liger, V in {32000, 50257, 128256, 151936, 262144}, batch 1-16, seq 512-8192, bf16
and fp16, members token-is, token-offpolicy-mask (masked) and sequence-offpolicy-mask (GSPO).

Per shape: torch's copy_ bandwidth is measured once per run (grpo_conform.hardware.measure_ceilings);
the floor is the logits read + the gradient written at that bandwidth (masked members: unmasked rows
read, sweep_plan.floors); the full call (forward + loss.backward(), d loss = 1) is timed on the device
with grpo_conform.timing.time_cuda (CUDA events, clean L2 flush, the validator's pre-start spin,
median); torch's own copy_ of the same logits gives what a plain copy of this size reaches. The
launch-bound call (1 x 16 x 128256) is timed as wall time (triton.testing.do_bench, and back-to-back
host time). --configs times every candidate of implementations/triton/configs.py that applies at a
shape (forced, plans rebuilt), checks its gradient against the shipped launch, and prints a proposed
TABLE. A shape that runs out of memory is skipped and said so; the run keeps a time budget (jobs that
would overrun it are skipped, named in the JSON) and rewrites the JSON after every job.

    python3 benchmarks/sweep_logits.py --out $OUT/sweep.json [--quick] [--configs] [--no-liger]
    python3 benchmarks/sweep_logits.py --plan [--quick] [--configs]   # the job list and its estimate, no GPU

A part of the grid (h200_evidence.sh sweep36b): --vocab 32000,50257 keeps the shapes at those vocabularies,
--control 128256:8 adds back the shapes at one vocabulary and batch, --configs-vocab 32000 keeps --configs
at those vocabularies, --no-launch leaves out the launch-bound call. The selection happens after the
grid is enumerated, so the priority order, the budget and the estimate are the full sweep's.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import sweep_plan as sp  # noqa: E402
from sweep_select import Selection, for_level, select  # noqa: E402
from sweep_cuda import (is_oom, liger_fn, load_impl, make_inputs, member_kwargs, prewarm,  # noqa: E402
                        staging_lost, timed_full)
import sweep_least  # noqa: E402

#: the report reads it (grpo-conform report --sweep FILE: grpo_conform/report/sweep.py)
RUN: dict = {"format": "grpo-conform-sweep/1", "rows": [], "configs": [], "launch": [], "skipped": [], "errors": []}


def run_shape(job, impl, liger, copy_bps) -> None:
    import torch
    from grpo_conform.timing import time_cuda

    shape = job["shape"]
    x, ids, adv, old, mask = make_inputs(shape, seed=shape.vocab + shape.batch + shape.seq)
    unmasked = int(mask.sum())
    fl = sp.floors(shape, unmasked, copy_bps)
    dst = torch.empty_like(x)
    ns = time_cuda(lambda: dst.copy_(x), reps=sp.reps_for(shape), warmup=2)
    copy_ms = sorted(ns)[len(ns) // 2] / 1e6
    del dst
    least = least_calls(x, adv, mask, shape)
    leaf = x.detach().requires_grad_(True)
    for member in sp.MEMBERS:
        kw = member_kwargs(member, ids, adv, old, mask)
        floor = sp.member_floor(member, fl)
        row = {**least.get(member, {}), "shape": shape.label(), "vocab": shape.vocab, "batch": shape.batch,
               "seq": shape.seq, "dtype": shape.dtype, "member": member, "level": sp.MEMBERS[member][0],
               "staged": shape.staged, "floor_ms": floor, "floors_ms": fl,
               "unmasked_fraction": unmasked / (shape.batch * shape.seq),
               "copy_ms": copy_ms, "copy_x_floor": copy_ms / fl["plain"], "reps": sp.reps_for(shape),
               "note": job.get("note", "")}
        for name, fn in (("ours", impl.grpo_loss), ("liger", liger if job.get("liger") else None)):
            if fn is None:
                continue
            try:
                row[f"{name}_ms"] = timed_full(fn, leaf, kw, sp.reps_for(shape))
            except Exception as exc:  # noqa: BLE001 -- recorded; a CUDA fault stops the run in main()
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row["note"] = (row.get("note", "") + f" {name}: {'OOM, skipped' if is_oom(exc) else 'error'}").strip()
                leaf.grad = None
                gc.collect()
                torch.cuda.empty_cache()
                if "CUDA error" in str(exc) or "illegal" in str(exc):
                    raise
        lost = staging_lost()
        if lost:
            row["staged_disabled"] = lost
            row["note"] = (row["note"] + " staging switched off (plain kernels timed)").strip()
        if row.get("least_ms"):
            row["least_x_floor"] = row["least_ms"] / floor
        if row.get("ours_ms"):
            row["ours_x_floor"] = row["ours_ms"] / floor
            if member.startswith("sequence"):
                row["ours_x_three_pass"] = row["ours_ms"] / fl["three_pass"]
            if row.get("liger_ms"):
                row["speedup_vs_liger"] = row["liger_ms"] / row["ours_ms"]
        RUN["rows"].append(row)
        print(sp.table([row]).splitlines()[1], flush=True)
    leaf.grad = None
    del x, leaf


def least_calls(x, adv, mask, shape) -> dict:
    """member -> the least call's fields at this shape (sweep_least.py), for the token-level members: the
    sequence level's target compares it with the token level, not with a floor. An error is recorded, never fatal
    (the least call is the bound beside the measurement, not the measurement)."""
    out: dict = {}
    for member, (level, masked, _old, _isl) in sp.MEMBERS.items():
        if level != "token":
            continue
        try:
            out[member] = sweep_least.least_ms(x, adv, mask, masked, sp.reps_for(shape), sp.WARMUP)
        except Exception as exc:  # noqa: BLE001
            out[member] = {"least_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            if "CUDA error" in str(exc) or "illegal" in str(exc):
                raise
    return out


def grad_of(fn, leaf, kw):
    leaf.grad = None
    loss = fn(logits=leaf, **kw)
    loss.backward()
    g, leaf.grad = leaf.grad, None
    return float(loss.detach()), g


def rel_diff(g, g0) -> float:
    worst, scale = 0.0, 0.0
    for b in range(g0.shape[0]):  # per sequence: fp32 copies of one batch row at a time
        a, r = g[b].float(), g0[b].float()
        worst = max(worst, float((a - r).abs().max()))
        scale = max(scale, float(r.abs().max()))
    return worst / scale if scale else (0.0 if worst == 0 else math.inf)


def run_configs(job, impl, configs) -> None:
    import torch

    shape = job["shape"]
    x, ids, adv, old, mask = make_inputs(shape, seed=shape.vocab + shape.batch)
    leaf = x.detach().requires_grad_(True)
    for member in job.get("members", sp.CONFIG_MEMBERS):
        level = sp.MEMBERS[member][0]
        kw = member_kwargs(member, ids, adv, old, mask)
        ref, seen = None, {}
        for name in for_level(configs)[(level, shape.staged)]:
            rec = {"shape": shape.label(), "vocab": shape.vocab, "dtype": shape.dtype, "member": member,
                   "level": level, "config": name}
            c = configs.CANDIDATES[name]
            launch = (c.settings(shape.vocab, getattr(torch, shape.dtype)) if shape.staged else None,
                      c.tuning_for(impl.GPU_TUNING, shape.vocab))
            if launch in seen:  # the same launch as an earlier candidate at this shape: not timed twice
                same = seen[launch]
                rec.update({k: same.get(k) for k in ("ms", "correct", "grad_rel_diff", "loss_rel_diff")},
                           same_as=same["config"])
                RUN["configs"].append(rec)
                continue
            seen[launch] = rec
            try:
                with configs.forced(name):
                    impl._PLANS.clear()
                    loss, g = grad_of(impl.grpo_loss, leaf, kw)
                    if ref is None:
                        ref = (loss, g)
                    rec["loss_rel_diff"] = abs(loss - ref[0]) / max(abs(ref[0]), 1e-30)
                    rec["grad_rel_diff"] = rel_diff(g, ref[1])
                    rec["correct"] = rec["grad_rel_diff"] <= 1e-2 and rec["loss_rel_diff"] <= 1e-4
                    del g
                    rec["ms"] = timed_full(impl.grpo_loss, leaf, kw, sp.reps_for(shape))
                    lost = staging_lost()
                    if lost:  # it ran on the plain kernels: not this candidate's time
                        rec.update(staged_disabled=lost, correct=False)
            except Exception as exc:  # noqa: BLE001
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                if "CUDA error" in str(exc) or "illegal" in str(exc):
                    raise
            finally:
                impl._PLANS.clear()
                leaf.grad = None
            RUN["configs"].append(rec)
            print(f"config {rec['shape']} {member} {name}: {rec.get('ms', rec.get('error'))} "
                  f"(grad rel diff {rec.get('grad_rel_diff')})", flush=True)
        del ref
    del x, leaf
    torch.cuda.empty_cache()


def run_launch(job, impl, liger) -> None:
    import torch
    from triton.testing import do_bench

    shape = job["shape"]
    x, ids, adv, old, mask = make_inputs(shape, seed=1)
    leaf = x.detach().requires_grad_(True)

    class Empty(torch.autograd.Function):  # the least an autograd call costs on this host
        @staticmethod
        def forward(ctx, t):
            return t.sum()

        @staticmethod
        def backward(ctx, g):
            return g.expand(4)

    tiny = torch.zeros(4, device="cuda", requires_grad=True)
    RUN["launch"].append({"impl": "empty-autograd-function", "full_wall_ms": do_bench(
        lambda: Empty.apply(tiny).backward(), warmup=25, rep=150, return_mode="median")})
    # the least full call (sweep_least.least_autograd_call): autograd's node and two device operations
    RUN["launch"].append({"impl": sweep_least.LEAST_CALL, "full_wall_ms": do_bench(
        sweep_least.least_autograd_call(x, adv), warmup=25, rep=150, return_mode="median")})
    for member in sp.MEMBERS:
        kw = member_kwargs(member, ids, adv, old, mask)
        for name, fn in (("ours", impl.grpo_loss), ("liger", liger)):
            if fn is None:
                continue

            def full():
                leaf.grad = None
                fn(logits=leaf, **kw).backward()

            def fwd():
                with torch.no_grad():
                    fn(logits=x, **kw)

            rec = {"impl": name, "member": member, "shape": shape.label()}
            try:
                rec["full_wall_ms"] = do_bench(full, warmup=25, rep=150, return_mode="median")
                rec["forward_wall_ms"] = do_bench(fwd, warmup=25, rep=150, return_mode="median")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(200):
                    full()
                torch.cuda.synchronize()
                rec["full_host_ms"] = (time.perf_counter() - t0) / 200 * 1e3
            except Exception as exc:  # noqa: BLE001
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            RUN["launch"].append(rec)
            print(f"launch-bound {rec}", flush=True)
    leaf.grad = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON results (rewritten after every job)")
    ap.add_argument("--quick", action="store_true", help="13 shapes (~3 min on an H200)")
    ap.add_argument("--configs", action="store_true", help="also compare configs.py's candidates per shape")
    ap.add_argument("--no-liger", action="store_true")
    ap.add_argument("--budget-s", type=float, default=370.0, help="skip jobs that would end later than this")
    ap.add_argument("--plan", action="store_true", help="print the jobs and the estimate; no GPU")
    ap.add_argument("--prewarm", type=int, default=12, help="processes compiling our kernels ahead (0: none)")
    ap.add_argument("--vocab", default="", help="only shapes at these vocabularies (comma-separated)")
    ap.add_argument("--control", default="", help="and the shapes at VOCAB:BATCH (comma-separated pairs)")
    ap.add_argument("--configs-vocab", default="", help="--configs only at these vocabularies")
    ap.add_argument("--configs-dtypes", default="bfloat16", help="--configs in these dtypes (comma-separated)")
    ap.add_argument("--configs-members", default=",".join(sp.CONFIG_MEMBERS),
                    help="--configs times these members' candidates (comma-separated; of the sweep's members)")
    ap.add_argument("--no-launch", action="store_true", help="leave out the launch-bound call")
    args = ap.parse_args()
    names = lambda text: tuple(v.strip() for v in text.split(",") if v.strip())  # noqa: E731
    bad = [d for d in names(args.configs_dtypes) if d not in sp.DTYPES]
    if bad:
        ap.error(f"--configs-dtypes: {', '.join(bad)} is not one of {', '.join(sp.DTYPES)}")
    try:
        planned = sp.jobs(args.quick, args.configs, liger=not args.no_liger, config_dtypes=names(args.configs_dtypes),
                          config_members=names(args.configs_members))
    except ValueError as exc:
        ap.error(str(exc))
    run = select(planned, Selection.of(args))
    _impl, configs = load_impl()
    items = sp.prewarm_items(run, for_level(configs)) if args.prewarm else []
    estimate = sp.estimate_total_s(run, args.prewarm, items)
    if args.plan:
        for j in run:
            print(j["kind"], j["shape"].label())
        print(f"{len(items)} kernel sets compiled ahead by {args.prewarm} processes "
              f"(~{sp.prewarm_s(items, args.prewarm):.0f} s)")
        print(f"{len(run)} jobs, estimated {estimate:.0f} s (budget {args.budget_s:.0f} s)")
        return 0
    return measure(args, run, estimate, _impl, configs)


def measure(args, run, estimate, impl, configs) -> int:
    import torch
    import triton
    from grpo_conform.evidence.identities import tree_identity
    from grpo_conform.hardware import measure_ceilings
    from grpo_conform.provenance import git_state

    start = time.time()
    if args.prewarm:  # the kernels of the jobs expected to fit the budget
        expected, compiled, total = [], set(), 0.0
        for job in run:
            total += sp.estimate_s(job, compiled, prewarmed=True)
            if total <= args.budget_s:
                expected.append(job)
        RUN["prewarm"] = prewarm(sp.prewarm_items(expected, for_level(configs)), args.prewarm, timeout_s=150.0)
        print(f"prewarm: {RUN['prewarm']}", flush=True)
    liger = None if args.no_liger else liger_fn()
    ceil = measure_ceilings("cuda")
    RUN["meta"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "liger": liger is not None, "copy_TBps": ceil.copy_bytes_per_s / 1e12,
                   "read_TBps": ceil.read_bytes_per_s / 1e12, "args": vars(args), "estimate_s": estimate,
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
                   "table": [configs.rule_source(r) for r in configs.TABLE],
                   # which code was timed: the report marks a file whose identity is not the checkout's
                   "identity": tree_identity(ROOT, "implementations/triton"), **git_state(),
                   "liger_version": liger_version()}
    print(f"copy {ceil.copy_bytes_per_s / 1e12:.3f} TB/s; {len(run)} jobs, estimated {estimate:.0f} s", flush=True)
    planned, spent_est, spent = set(), 0.0, 0.0
    for job in run:
        trial = set(planned)
        est = sp.estimate_s(job, trial, prewarmed=bool(args.prewarm))
        scale = min(4.0, max(0.5, spent / spent_est)) if spent_est > 20 else 1.0
        left = args.budget_s - (time.time() - start)
        if est * scale > left and job.get("liger"):  # what is left may still fit without Liger
            job = dict(job, liger=False, note="Liger left out: budget")
            trial = set(planned)
            est = sp.estimate_s(job, trial, prewarmed=bool(args.prewarm))
        if est * scale > left:
            RUN["skipped"].append({"kind": job["kind"], "shape": job["shape"].label(), "why": "budget",
                                   "estimate_s": est * scale, "left_s": left})
            continue
        t0 = time.time()
        try:
            {"shape": run_shape, "configs": run_configs, "launch": run_launch}[job["kind"]](
                job, impl, *((liger, ceil.copy_bytes_per_s) if job["kind"] == "shape" else
                             (configs,) if job["kind"] == "configs" else (liger,)))
        except Exception as exc:  # noqa: BLE001 -- one shape never ends the sweep, a CUDA fault does
            why = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:300]}"
            RUN["skipped"].append({"kind": job["kind"], "shape": job["shape"].label(), "why": why})
            print(f"skipped {job['kind']} {job['shape'].label()}: {why}", flush=True)
            if "CUDA error" in str(exc) or "illegal" in str(exc):
                break
        finally:
            gc.collect()
            torch.cuda.empty_cache()
        planned, spent_est, spent = trial, spent_est + est, spent + time.time() - t0
        finish(args, start, final=False)
    return finish(args, start, final=True)


def liger_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # the one place the sweep names Liger's version

    try:
        return version("liger-kernel")
    except PackageNotFoundError:
        return None


def finish(args, start, final: bool) -> int:
    best = sp.best_configs(RUN["configs"])
    rules, source = sp.propose(RUN["configs"])
    RUN.update(best_configs=best, proposal={"rules": rules, "source": source},
               verdicts=sp.verdicts(RUN) if RUN.get("meta") and RUN["rows"] else [], elapsed_s=time.time() - start)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        sp.write_json(args.out, RUN)
    if final:  # the output's tail is what a device call shows: the verdicts and the proposal come last
        print("\n" + sp.summary(RUN["rows"]))
        if RUN["launch"]:
            print("\nlaunch-bound 1 x 16 x 128256 bf16, wall ms (do_bench / host clock): " + "; ".join(
                f"{r['impl']} {r.get('member', '')} {r.get('full_wall_ms', float('nan')):.4f} / "
                f"{r.get('full_host_ms', float('nan')):.4f}" for r in RUN["launch"]))
        if best:
            print("\n" + sp.config_table(best) + "\n\nproposed configs.TABLE:\n" + source)
        if RUN["skipped"]:
            why = {}
            for s in RUN["skipped"]:
                why.setdefault(s["why"][:40], []).append(s["shape"])
            print("\nskipped: " + "; ".join(f"{k} ({len(v)}): {', '.join(v[:4])}{' ...' if len(v) > 4 else ''}"
                                            for k, v in why.items()))
        print("\n" + "\n".join(RUN["verdicts"]) + f"\nelapsed {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
