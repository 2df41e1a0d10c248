"""The device half of benchmarks/sweep_logits.py (issue 36): loading implementations/triton and Liger, the
inputs of a shape, one timed full call, and the processes that compile the run's kernels ahead
(`prewarm`; this file is their entry point: `python3 sweep_cuda.py ITEMS.json`).

SWEEP_DEVICE=cpu (tests/test_sweep_logits.py, under TRITON_INTERPRET=1) puts the inputs on the CPU and
skips CUDA synchronisation; SWEEP_PREWARM_SEQ sets the prewarm calls' sequence length (1024).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import sweep_plan as sp  # noqa: E402

DEVICE = os.environ.get("SWEEP_DEVICE", "cuda")
PREWARM_SEQ = int(os.environ.get("SWEEP_PREWARM_SEQ", "1024"))


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


PKG = "grpo_impl_triton_sweep"


def load_impl():
    if PKG not in sys.modules:
        pkg = types.ModuleType(PKG)
        pkg.__path__ = [str(ROOT / "implementations" / "triton")]
        sys.modules[PKG] = pkg
    return importlib.import_module(PKG + ".impl"), importlib.import_module(PKG + ".configs")


def staging_lost() -> list:
    """Why staged_members switched the staged kernels off in this process (then cleared, so that the next
    plans stage again): a candidate that fails to compile must not turn the rest of the sweep plain."""
    sm = sys.modules.get(PKG + ".staged_members")
    if sm is None or not sm.DISABLED:
        return []
    why = list(sm.DISABLED)
    sm.DISABLED.clear()
    return why


def liger_fn():
    try:
        from liger_kernel.ops.grpo_loss import GrpoLossFunction
    except ImportError:
        return None

    def call(logits, completion_ids, advantages, old_logprobs=None, completion_mask=None, epsilon_low=0.2,
             epsilon_high=0.2, temperature=1.0, loss_type="grpo", importance_sampling_level="token", **_):
        return GrpoLossFunction.apply(logits, old_logprobs, None, completion_ids, advantages, completion_mask,
                                      temperature, 0.0, epsilon_low, epsilon_high, False, loss_type, None, True,
                                      importance_sampling_level)[0]
    return call


def make_inputs(shape: sp.Shape, seed: int):
    import torch

    dev = DEVICE
    g = torch.Generator(device=dev).manual_seed(seed)
    b, s, v = shape.batch, shape.seq, shape.vocab
    x = torch.randn(b, s + 1, v, device=dev, dtype=getattr(torch, shape.dtype), generator=g).mul_(2)
    ids = torch.randint(0, v, (b, s), device=dev, generator=g)
    adv = torch.randn(b, device=dev, generator=g) + 0.5
    logp = torch.empty(b, s, device=dev)
    step = max(1, (1 << 28) // v)  # rows per log-sum-exp slice: ~1 GB of fp32 at most
    for i in range(b):
        for t0 in range(0, s, step):
            t1 = min(s, t0 + step)  # completion positions only (row s is the last logits row)
            xs = x[i, t0:t1].float()
            logp[i, t0:t1] = xs.gather(-1, ids[i, t0:t1, None])[:, 0] - torch.logsumexp(xs, -1)
            del xs
    old = (logp + 0.3 * torch.randn(b, s, device=dev, generator=g)).contiguous()
    lens = torch.randint(s // 2, s + 1, (b,), device=dev, generator=g)
    mask = (torch.arange(s, device=dev)[None] < lens[:, None]).to(torch.int64).contiguous()
    return x, ids, adv, old, mask


def member_kwargs(member: str, ids, adv, old, mask) -> dict:
    _level, masked, has_old, isl = sp.MEMBERS[member]
    kw = dict(completion_ids=ids, advantages=adv, epsilon_low=0.2, epsilon_high=0.2 if not masked else 0.28,
              temperature=1.0)
    if masked:
        kw.update(completion_mask=mask, loss_type="grpo", importance_sampling_level=isl)
    if has_old:
        kw["old_logprobs"] = old
    return kw


def timed_full(fn, leaf, kw, reps: int) -> float:
    from grpo_conform.isolation.worker import spin_cycles_for
    from grpo_conform.timing import time_cuda

    def full():
        leaf.grad = None
        fn(logits=leaf, **kw).backward()

    full()
    sync()
    t0 = time.perf_counter_ns()
    full()
    enqueue = time.perf_counter_ns() - t0
    sync()
    ns = time_cuda(full, reps=reps, warmup=sp.WARMUP, spin_cycles=spin_cycles_for(enqueue))
    return sorted(ns)[len(ns) // 2] / 1e6


def is_oom(exc: Exception) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "allocate memory" in text


def prewarm_worker(path: str) -> int:
    """One worker of `prewarm`: a full call of each listed kernel set (sweep_plan.prewarm_items)."""
    import json

    import torch

    impl, configs = load_impl()
    liger = liger_fn()
    for vocab, dtype, member, config, seq in json.loads(Path(path).read_text()):
        x = leaf = None
        try:
            shape = sp.Shape(vocab, 1, seq, dtype) if config == "liger" else sp.Shape(vocab, 2, PREWARM_SEQ, dtype)
            x, ids, adv, old, mask = make_inputs(shape, seed=0)
            leaf = x.detach().requires_grad_(True)
            kw = member_kwargs(member, ids, adv, old, mask)
            if config == "liger":
                if liger is not None:
                    liger(logits=leaf, **kw).backward()
            else:
                with configs.forced(config):
                    impl._PLANS.clear()
                    impl.grpo_loss(logits=leaf, **kw).backward()
            sync()
        except Exception as exc:  # noqa: BLE001 -- the timed job will meet it again and record it
            print(f"prewarm {vocab} {dtype} {member} {config} {seq}: {type(exc).__name__}: {str(exc)[:200]}",
                  flush=True)
        finally:
            impl._PLANS.clear()
            del x, leaf
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return 0


def prewarm(items: list, workers: int, timeout_s: float) -> dict:
    """Compile the run's kernels ahead in `workers` processes (Triton's on-disk cache is shared and written
    atomically); whatever is not done by timeout_s is compiled by the timed jobs themselves."""
    import json
    import subprocess
    import tempfile

    t0 = time.time()
    folder = Path(tempfile.mkdtemp(prefix="sweep-prewarm-"))
    procs = []
    for w, part in enumerate(sp.prewarm_buckets(items, workers)):
        if not part:
            continue
        f = folder / f"items-{w}.json"
        f.write_text(json.dumps(part))
        procs.append(subprocess.Popen([sys.executable, __file__, str(f)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    notes = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, timeout_s - (time.time() - t0)))
            notes += [line for line in out.splitlines() if line.startswith("prewarm ")]
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            notes.append("prewarm worker stopped at its timeout")
    return {"items": len(items), "workers": len(procs), "seconds": time.time() - t0, "notes": notes[:50]}


if __name__ == "__main__":
    sys.exit(prewarm_worker(sys.argv[1]))
