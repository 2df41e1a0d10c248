"""Why is Liger 0.8.5's fused linear + GRPO ~12x the three GEMMs on an H200? One probe, seed shape."""
import json, os, statistics, sys, time
import torch
from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOLoss

OUT = os.environ.get("OUT", "/tmp/out")
dev = "cuda"
B, T, H, V = 2, 1024, 4096, 128256
N = B * T
torch.manual_seed(0)
h = (torch.randn(B, T, H, device=dev, dtype=torch.bfloat16) * 0.5)
W = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) * 0.02)
ids = torch.randint(0, V, (B, T), device=dev)
mask = torch.ones(B, T, device=dev, dtype=torch.int64)
adv = torch.randn(B, device=dev)
res = {}

def timeit(fn, reps=5, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)

h2 = h.reshape(N, H)
g = torch.randn(N, V, device=dev, dtype=torch.bfloat16) * 1e-3
res["gemm_logits_ms"] = timeit(lambda: h2 @ W.t())
res["gemm_dhidden_ms"] = timeit(lambda: g @ W)
res["gemm_dweight_ms"] = timeit(lambda: g.t() @ h2)
res["three_gemms_ms"] = res["gemm_logits_ms"] + res["gemm_dhidden_ms"] + res["gemm_dweight_ms"]
del g
# one vocab chunk of Liger's backward, in fp32 as it runs (grad_logits fp32 [N, 4096] @ W_chunk.float())
gc = torch.randn(N, 4096, device=dev) * 1e-3
Wc = W[:4096]
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    t = timeit(lambda: (gc @ Wc.float(), gc.t() @ h2.float()), reps=10)
    res[f"chunk_bwd_fp32_gemms_ms_tf32_{tf32}"] = t
    res[f"chunk_bwd_fp32_tflops_tf32_{tf32}"] = 2 * 2 * N * 4096 * H / (t * 1e-3) / 1e12
torch.backends.cuda.matmul.allow_tf32 = False
del gc

def liger_full(loss_mod):
    hh = h.detach().requires_grad_(True)
    ww = W.detach().requires_grad_(True)
    def run():
        hh.grad = None; ww.grad = None
        loss = loss_mod(hh, ww, ids, mask, adv)
        loss = loss[0] if isinstance(loss, tuple) else loss
        loss.backward()
    return run

for compiled in (True, False):
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        mod = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, compiled=compiled, loss_type="grpo")
        run = liger_full(mod)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = timeit(run, reps=3, warm=2)
        res[f"liger_full_ms_compiled_{compiled}_tf32_{tf32}"] = t
        res[f"liger_full_peak_extra_gib_compiled_{compiled}_tf32_{tf32}"] = (torch.cuda.max_memory_allocated() - base) / 2**30
torch.backends.cuda.matmul.allow_tf32 = False
mod = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, compiled=True, loss_type="grpo")
run = liger_full(mod)
run(); torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    run(); torch.cuda.synchronize()
agg = {}
for ev in prof.key_averages():
    if ev.device_type.name == "CUDA" or getattr(ev, "self_device_time_total", 0) > 0:
        agg[ev.key] = agg.get(ev.key, 0) + getattr(ev, "self_device_time_total", getattr(ev, "self_cuda_time_total", 0))
top = sorted(agg.items(), key=lambda kv: -kv[1])[:10]
res["profile_top_kernels_ms"] = [[k[:120], v / 1000] for k, v in top]
res["profile_total_ms"] = sum(agg.values()) / 1000
res["env"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "liger": "0.8.5"}
json.dump(res, open(f"{OUT}/fused_liger_probe.json", "w"), indent=1)
for k, v in res.items():
    if k != "profile_top_kernels_ms":
        print(k, v)
for k, v in res["profile_top_kernels_ms"]:
    print(f"{v:9.3f} ms  {k}")
