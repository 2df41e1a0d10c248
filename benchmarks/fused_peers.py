"""The contenders of benchmarks/fused_bench.py other than the floor: seeded inputs at the seed shape, the
member's loss in torch (eager), Liger's LigerFusedLinearGRPOLoss, the composition of cuBLAS with
implementations/triton's logits kernel, and implementations/triton-fused. Each `*_loss` returns
loss(leaves) for leaves {"hidden", "weight"} (tensors that may require grad).
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def load_folder(name: str, package: str):
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(ROOT / "implementations" / name)]
    sys.modules[package] = pkg
    return pkg


# -- inputs and the member's loss in torch --------------------------------------------------------------
MEMBERS = {  # name: (has old, beta, level, loss_type)
    "token-is": (False, 0.0, "token", "grpo"),
    "offpolicy-mask": (True, 0.0, "token", "grpo"),
    "kl": (True, 0.04, "token", "grpo"),
    "sequence": (True, 0.0, "sequence", "grpo"),
    "bnpo": (True, 0.0, "token", "bnpo"),
}


def make_inputs(batch, seq, hidden, vocab, member, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    has_old, beta, _level, _lt = MEMBERS[member]
    x = {"hidden": (torch.randn(batch, seq, hidden, device=device, generator=g) * 2).to(torch.bfloat16),
         "weight": (torch.randn(vocab, hidden, device=device, generator=g) / math.sqrt(hidden)).to(torch.bfloat16),
         "completion_ids": torch.randint(0, vocab, (batch, seq), device=device, generator=g),
         "advantages": torch.randn(batch, device=device, generator=g)}
    if member != "token-is":
        lengths = torch.randint(seq // 2, seq + 1, (batch,), device=device, generator=g)
        x["completion_mask"] = torch.arange(seq, device=device)[None, :] < lengths[:, None]
    if has_old:  # near the current policy: ratios on both sides of the clip
        with torch.no_grad():
            lp = []
            for b in range(batch):
                z = (x["hidden"][b] @ x["weight"].T).float()
                lp.append(z.gather(-1, x["completion_ids"][b][:, None])[:, 0] - torch.logsumexp(z, -1))
            lp = torch.stack(lp)
        x["old_logprobs"] = lp + 0.2 * torch.randn(batch, seq, device=device, generator=g)
    if beta:
        x["ref_logprobs"] = x["old_logprobs"] + 0.1 * torch.randn(batch, seq, device=device, generator=g)
    return x


def params_of(member, seq):
    _old, beta, level, loss_type = MEMBERS[member]
    p = dict(epsilon_low=0.2, epsilon_high=0.2, temperature=1.0)
    if member != "token-is":
        p.update(loss_type=loss_type, importance_sampling_level=level)
    if beta:
        p["beta"] = beta
    return p


def grpo_terms_torch(logp, x, p):
    """The member's loss from log-probs [B, T] (float32 autograd)."""
    old = x.get("old_logprobs", logp.detach())
    mask = x.get("completion_mask", torch.ones_like(logp, dtype=torch.bool)).to(logp.dtype)
    adv = x["advantages"][:, None]
    lr = logp - old
    n_b = mask.sum(-1).clamp_min(1)
    if p.get("importance_sampling_level") == "sequence":
        lr = ((lr * mask).sum(-1) / n_b)[:, None].expand_as(logp)
    r = torch.exp(lr)
    per = -torch.minimum(r * adv, r.clamp(1 - p["epsilon_low"], 1 + p["epsilon_high"]) * adv)
    if p.get("beta"):
        d = x["ref_logprobs"] - logp
        per = per + p["beta"] * (torch.exp(d) - d - 1)
    if p.get("loss_type", "grpo") == "bnpo":
        return (per * mask).sum() / mask.sum().clamp_min(1)
    return ((per * mask).sum(-1) / n_b).mean()


def eager(x, p, fp32=False):
    h, w = x["hidden"], x["weight"]
    if fp32:
        h, w = h.float(), w.float()
    logits = (h @ w.T).float() / p["temperature"]
    logp = torch.log_softmax(logits, -1).gather(-1, x["completion_ids"][..., None])[..., 0]
    return grpo_terms_torch(logp, x, p)


def liger_loss(x, p, member):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    _old, beta, level, loss_type = MEMBERS[member]
    ctor = dict(beta=beta, use_ref_model=False, epsilon_low=p["epsilon_low"], epsilon_high=p["epsilon_high"],
                loss_type=loss_type, importance_sampling_level=level, temperature=p["temperature"])
    accepted = inspect.signature(LigerFusedLinearGRPOLoss.__init__).parameters
    fn = LigerFusedLinearGRPOLoss(**{k: v for k, v in ctor.items() if k in accepted})
    mask = x.get("completion_mask", torch.ones_like(x["completion_ids"], dtype=torch.bool)).to(torch.int64)

    takes = inspect.signature(fn.forward).parameters
    if "selected_token_ids" not in takes:
        raise ImportError(f"LigerFusedLinearGRPOLoss.forward{inspect.signature(fn.forward)}: not the 0.6-0.8 call")

    def loss(lv):
        kw = dict(_input=lv["hidden"], lin_weight=lv["weight"], selected_token_ids=x["completion_ids"],
                  attention_mask=mask, advantages=x["advantages"], ref_per_token_logps=x.get("ref_logprobs"),
                  old_per_token_logps=x.get("old_logprobs"))
        out = fn(**{k: v for k, v in kw.items() if k in takes})
        return out[0] if isinstance(out, tuple) else out
    return loss


def compose_loss(x, p):
    pkg = load_folder("triton", "fused_bench_triton")
    impl = importlib.import_module(pkg.__name__ + ".impl")
    seq = x["completion_ids"].shape[1]
    kw = {k: x[k][:, : seq - 1].contiguous() for k in ("old_logprobs", "ref_logprobs", "completion_mask") if k in x}

    def loss(lv):
        logits = lv["hidden"] @ lv["weight"].T  # [B, T, V]: the last position is the logits kernel's extra row
        return impl.grpo_loss(logits, x["completion_ids"][:, : seq - 1].contiguous(), x["advantages"], **kw, **p)
    return loss


def ours_loss(x, p, settings):
    pkg = load_folder("triton-fused", "fused_bench_ours")
    impl = importlib.import_module(pkg.__name__ + ".impl")
    rest = {k: v for k, v in x.items() if k not in ("hidden", "weight")}

    def loss(lv):
        return impl.grpo_fused_linear_loss(lv["hidden"], lv["weight"], settings=settings, **rest, **p)
    return loss, impl
