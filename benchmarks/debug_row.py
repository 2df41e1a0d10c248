"""Reproduce one gradient row of a failed check on the GPU and show where the kernel departs from
float64 (device tool). Usage: debug_row.py SEED B T"""
import importlib, json, sys, types
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grpo_conform.ops.grpo_logits import inputs as gen  # noqa: E402
from grpo_conform.spec import load_spec  # noqa: E402

pkg = types.ModuleType("gi"); pkg.__path__ = [str(ROOT / "implementations" / "triton")]; sys.modules["gi"] = pkg
launch = importlib.import_module("gi.launch")

seed, b, t = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
spec = load_spec(ROOT / "specs" / "grpo-token-is.v1.json")
rw = spec.resolve(spec.workload("seed-b16"))
P = gen.generate(spec, rw, seed, "cuda").tensors
logits, ids, adv = P["logits"], P["completion_ids"], P["advantages"]
S, V = logits.shape[1] - 1, logits.shape[2]
x = logits[b, t].double().cpu()
tgt = int(ids[b, t])
lse = torch.logsumexp(x, 0)
p = torch.exp(x - lse)
coef = float(adv[b]) / (logits.shape[0] * S)
ref = coef * p; ref[tgt] -= coef
top = torch.topk(x, 6)
print(json.dumps({"target": tgt, "x_target": float(x[tgt]), "lse": float(lse), "p_target": float(p[tgt]),
                  "top_values": top.values.tolist(), "top_idx": top.indices.tolist(), "coef": coef,
                  "min": float(x.min()), "max": float(x.max())}))
prob = launch.Problem.of(logits, 0.2, 0.2, 1.0)
for name, s in (("staged-ts1", launch.GPU_DEFAULT), ("staged-ts0", replace(launch.GPU_DEFAULT, thread_stats=False)),
                ("split", launch.STAGED_FALLBACK)):
    loss, grad, stats = launch.fused_loss_and_grad(logits, ids, adv, prob, s)
    lse_k = launch.lse_of(stats, prob)
    g = grad[b, t].double().cpu()
    d = (g - ref).abs()
    worst = torch.topk(d, 3)
    print(json.dumps({"variant": name, "lse_kernel": float(lse_k[b * S + t]), "lse_ref": float(lse),
                      "worst_idx": worst.indices.tolist(), "worst_abs": worst.values.tolist(),
                      "actual": [float(g[i]) for i in worst.indices], "expected": [float(ref[i]) for i in worst.indices],
                      "row_sum": float(g.sum())}))
    del grad
