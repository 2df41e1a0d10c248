"""implementations/triton-fused (the lm_head GEMM fused with the GRPO loss) under TRITON_INTERPRET=1 on
the CPU, against the float64 reference of the fused op (grpo_conform/ops/fused_linear/reference.py),
through autograd as a trainer calls it.

Every member the folder declares, float32 and bfloat16, B 2, T 8, H 32, V 129: the loss and the
gradients of hidden, weight and bias; chunks of 5 rows (they split sequences; sequence-level members
round them to whole sequences) with a float32 weight-gradient accumulator (the halves one, or for the
members of TRITON_GEMM the plain float32 buffer through the Triton GEMM), chunks of 5 rows holding
d logits with float32 logits, and chunks of 5 rows holding d logits in the weight's dtype; an upstream
scalar != 1 (0.37), and for token-offpolicy-mask-kl in float32 the scalars 1, 0.25, 0.25, 1 on one plan
(the forward folds in the predicted scalar, backward rescales where it was wrong). The accumulator's
bfloat16 GEMM runs through the Triton kernel (_acc_gemm_kernel, half of the interpreter's time) for the
members of TRITON_GEMM, which between them give it every shape it sees here (K 5 and 8 rows, with and
without a bias, two weights), and through the CPU's float32 addmm for the others: the kernel does not
depend on the member, the accumulator's plan runs for every member either way;
the forward under torch.no_grad and the GEMMs it runs (the logits GEMM only, per forward chunk; none
where the loss does not read the logits), through the pipelined sweep (one step, and steps of 32 with a
partial last one) and the plain one; a second backward through a retained graph; masked rows of hidden, reference
hidden and old log-probs poisoned with NaN. One subprocess (the variable must be set before triton is
imported). Fast lane: the auto strategy at the seed shape, GSPO chunking, the copies in vendored.py
equal to their originals. Slow lane also: every kernel compiles for sm_90.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("triton", reason="the Triton implementation needs triton")

FOLDER = ROOT / "implementations" / "triton-fused"

SCRIPT = r'''
import importlib, json, math, sys, types
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from grpo_conform.ops.fused_linear.reference import dense_gradients, reference_loss
from grpo_conform.ops.grpo_terms import GrpoParameters

folder = sys.argv[1]
pkg = types.ModuleType("grpo_impl_triton_fused"); pkg.__path__ = [folder]; sys.modules[pkg.__name__] = pkg
impl = importlib.import_module(pkg.__name__ + ".impl")
S = importlib.import_module(pkg.__name__ + ".semantics").FusedSettings
acc_mod = importlib.import_module(pkg.__name__ + ".accumulator")
GEMMS = [0]  # launches of the accumulator's Triton GEMM (accumulator._triton_accumulate), counted per plan below
_triton_accumulate = acc_mod._triton_accumulate
def _counted(*a, **k):
    GEMMS[0] += 1
    return _triton_accumulate(*a, **k)
acc_mod._triton_accumulate = _counted
B, T, H, V = 2, 8, 32, 129  # V 2^7 + 1: a partial last tile in every kernel (V 257 until 2026-12-03: the CPU GEMM's 16-row tiles 17 -> 9)
BASE = dict(epsilon_low=0.2, epsilon_high=0.28, temperature=0.8)
MEMBERS = {
    "token-is": (dict(), {}),
    "token-is-bias": (dict(bias=True), {}),
    "token-offpolicy-mask": (dict(mask=True, old=True), dict(loss_type="grpo")),
    "token-offpolicy-mask-kl": (dict(mask=True, old=True, ref="given"), dict(loss_type="grpo", beta=0.1)),
    "token-offpolicy-mask-kl-ref-weight": (dict(mask=True, old=True, ref="weight"), dict(loss_type="grpo", beta=0.1)),
    "bnpo-mask": (dict(mask=True, old=True), dict(loss_type="bnpo")),
    "dr-grpo-mask": (dict(mask=True, old=True), dict(loss_type="dr_grpo", max_completion_length=10)),
    "dapo-mask": (dict(mask=True, old=True), dict(loss_type="dapo")),
    "sequence-offpolicy-mask": (dict(mask=True, old=True), dict(loss_type="grpo", importance_sampling_level="sequence")),
}
TRITON_GEMM = ("token-is-bias", "token-offpolicy-mask-kl-ref-weight", "sequence-offpolicy-mask")
# the default settings (one vocabulary tile of 256, BK 32), then tiles of 16 x 32 x 16: five vocabulary tiles, the
# last partial, two steps over H
EPILOGUE = (S(), S(forward_epilogue_tile=(16, 32, 16, 1, 4)))
SCALES = ("token-offpolicy-mask-kl", "float32")  # the run whose second plan takes the scalars 1, 0.25, 0.25, 1


def inputs(dtype, seed, bias=False, mask=False, old=False, ref=None):
    g = torch.Generator().manual_seed(seed)
    x = {"hidden": (torch.randn(B, T, H, generator=g) * 2).to(dtype),
         "weight": (torch.randn(V, H, generator=g) / math.sqrt(H)).to(dtype),
         "completion_ids": torch.randint(0, V, (B, T), generator=g),
         "advantages": torch.tensor([0.8, -1.3])}
    x["completion_ids"][0, 0], x["completion_ids"][1, T - 1] = 0, V - 1  # the vocabulary's two ends
    if bias:
        x["bias"] = torch.randn(V, generator=g).to(dtype)
    if mask:
        x["completion_mask"] = torch.tensor([[1] * 5 + [0] * 3, [0] + [1] * 6 + [0]], dtype=torch.bool)
    with torch.no_grad():
        z = x["hidden"].double() @ x["weight"].double().T + (x["bias"].double() if bias else 0.0)
        lp = torch.log_softmax(z / BASE["temperature"], -1).gather(-1, x["completion_ids"][..., None])[..., 0]
    if old:  # ratios on both sides of the clip
        x["old_logprobs"] = (lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).float()
    if ref == "given":
        x["ref_logprobs"] = (lp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).float()
    elif ref == "weight":
        x["ref_weight"] = (x["weight"].float() + 0.05 * torch.randn(V, H, generator=g)).to(dtype)
        x["ref_hidden"] = (x["hidden"].float() + 0.3 * torch.randn(B, T, H, generator=g)).to(dtype)
    return x


def poisoned(x):
    """NaN where the mask is 0: hidden rows, ref hidden rows and old log-probs must not matter there."""
    if "completion_mask" not in x:
        return x
    y = dict(x)
    off = ~x["completion_mask"]
    for k in ("hidden", "ref_hidden"):
        if k in y:
            y[k] = y[k].clone(); y[k][off] = float("nan")
    y["old_logprobs"] = y["old_logprobs"].clone(); y["old_logprobs"][off] = float("nan")
    return y


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.gemms = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm"):
            self.gemms += 1
        return func(*args, **(kwargs or {}))


def rel(got, want):
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-300))


def call(x, params, settings, scales):
    """One plan, one call per upstream scalar: [(loss, {name: grad}), ...]; the last one also backs up twice."""
    out = []
    for i, c in enumerate(scales):
        leaves = {k: x[k].clone().requires_grad_() for k in ("hidden", "weight", "bias") if k in x}
        rest = {k: v for k, v in x.items() if k not in leaves}
        loss = impl.grpo_fused_linear_loss(**leaves, **rest, settings=settings, **params)
        last = i == len(scales) - 1
        (loss * c).backward(retain_graph=last)
        grads = {k: v.grad.clone() for k, v in leaves.items()}
        second = None
        if last:
            for v in leaves.values():
                v.grad = None
            (loss * 2.5).backward()
            second = {k: v.grad.clone() for k, v in leaves.items()}
        out.append((loss.item(), grads, second))
    return out


results = {}
for m_i, (member, (kw, extra)) in enumerate(MEMBERS.items()):
    params = {**BASE, **extra}
    for dtype in (torch.float32, torch.bfloat16):
        x = inputs(dtype, 3 + m_i, **kw)
        x64 = {k: (v.double() if v.is_floating_point() else v) for k, v in x.items()}
        p = GrpoParameters.from_mapping(params)
        want_loss, want = reference_loss(x64, p), dense_gradients(x64, p)
        r = {"ref_loss": want_loss, "calls": [], "forward": []}
        # chunks of 5 rows (they split sequences) with the float32 accumulator (its Triton GEMM for the
        # members of TRITON_GEMM), upstream 0.37; chunks of 5 rows holding d logits with float32 logits
        # (the scalars 1, 0.25, 0.25, 1 for SCALES); chunks of 5 rows holding d logits in the weight's dtype;
        # each call's last backward is followed by a second one (2.5) through the retained graph. The
        # forward-only calls: the pipelined sweep in chunks of 5 (one step of 256 for V 129; steps of 32
        # over float32 logits, a partial last one), then the plain sweep over one chunk of all 16 rows.
        gemm = "triton" if member in TRITON_GEMM else "auto"
        cublas = dict(forward_gemm="cublas")  # the sweeps' forward (the epilogue's: EPILOGUE below)
        runs = [(S(chunk_rows=5, weight_grad="fp32" if gemm == "triton" else "halves", accumulate=gemm, **cublas),
                 (0.37,)),
                (S(chunk_rows=5, weight_grad="hold", logits="float32", forward_block=32, **cublas),
                 (1.0, 0.25, 0.25, 1.0) if (member, dtype) == (SCALES[0], getattr(torch, SCALES[1])) else (1.0,)),
                (S(chunk_rows=5, weight_grad="hold", forward_rows=16, forward_sweep="plain", **cublas), (1.0,))]
        r["accumulate"] = gemm
        r["triton_gemms"] = []
        for s_i, (settings, scales) in enumerate(runs):
            GEMMS[0] = 0
            for (loss, grads, second), c in zip(call(poisoned(x), params, settings, scales), scales):
                e = {"settings": s_i, "scale": c, "loss": loss, "names": sorted(grads),
                     "finite": all(bool(torch.isfinite(g).all()) for g in grads.values()),
                     "rel": {k: rel(g, c * want[k]) for k, g in grads.items()}}
                if "completion_mask" in x:
                    e["masked_zero"] = bool((grads["hidden"][~x["completion_mask"]] == 0).all())
                if second is not None:
                    e["second_rel"] = {k: rel(g, 2.5 * want[k]) for k, g in second.items()}
                r["calls"].append(e)
            with torch.no_grad(), Count() as count:
                fwd = impl.grpo_fused_linear_loss(**poisoned(x), settings=settings, **params)
            r["forward"].append({"loss": float(fwd), "gemms": count.gemms})
            r["triton_gemms"].append(GEMMS[0])
        for settings in EPILOGUE:  # forward-only through epilogue.py (bfloat16; float32 falls back to cuBLAS)
            with torch.no_grad(), Count() as count:
                fwd = impl.grpo_fused_linear_loss(**poisoned(x), settings=settings, **params)
            r["forward"].append({"loss": float(fwd), "gemms": count.gemms})
        results[f"{member}/{str(dtype).split('.')[-1]}"] = r
# epilogue.py's kernels alone against float64: a bias, 19 rows (two row blocks, the second partial), V 300 (five
# vocabulary tiles of 64, the last partial), H 48 (three steps of 16), masked rows poisoned with NaN
ep = importlib.import_module(pkg.__name__ + ".epilogue")
g = torch.Generator().manual_seed(7)
n, h_, v_ = 19, 48, 300
hid = torch.randn(n, h_, generator=g).to(torch.bfloat16)
w = (torch.randn(v_, h_, generator=g) / 7).to(torch.bfloat16)
bias = torch.randn(v_, generator=g).to(torch.bfloat16)
ids = torch.randint(0, v_, (n,), generator=g)
mask = (torch.arange(n) % 5 != 3).to(torch.uint8)
hid[mask == 0] = float("nan")
inv_t = float(torch.tensor(1 / 0.7, dtype=torch.float32))
z = hid.double() @ w.double().T + bias.double()
want_lp = (z * (1 / 0.7)).log_softmax(-1).gather(1, ids[:, None])[:, 0]
st = ep.EpilogueStats(n, v_, h_, torch.device("cpu"), S(forward_epilogue_tile=(16, 64, 16, 1, 4)), inv_t, 1 / 0.7 - inv_t)
out = torch.empty(3 * n)
st.run(hid, w, bias, ids, mask, out, n, logp_only=False)
lp = torch.full((n,), 7.0)
st.run(hid, w, bias, ids, mask, lp, n, logp_only=True)
live = mask != 0
got_lp = (out[2 * n:].double() - out[:n].double()) * (1 / 0.7) - out[n: 2 * n].double()
results["_epilogue"] = {"tiles": [st.bm, st.bn, st.bk, st.nt, st.group],
                        "triple_err": float((got_lp - want_lp)[live].abs().max()),
                        "target_err": float((out[2 * n:].double() - z.gather(1, ids[:, None])[:, 0])[live].abs().max()),
                        "logp_err": float((lp.double() - want_lp)[live].abs().max()),
                        "masked_logp": lp[~live].tolist(), "masked_triple": out.view(3, n)[:, ~live].flatten().tolist()}
print(json.dumps(results))
'''

DECLARED = ("token-is", "token-is-bias", "token-offpolicy-mask", "token-offpolicy-mask-kl",
            "token-offpolicy-mask-kl-ref-weight", "bnpo-mask", "dr-grpo-mask", "dapo-mask", "sequence-offpolicy-mask")
# (loss relative, gradient normwise relative): float32 is the GEMMs' rounding; bfloat16 is the logits
# rounded to bfloat16 (|z| ~ 6: 1/64 absolute, p off by ~1.5%) and the gradients rounded once (or twice
# where the upstream scalar was mispredicted).
TOLERANCE = {"float32": (1e-5, 1e-4), "bfloat16": (1e-2, 4e-2)}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One subprocess for both tests below (a second one, as the short run had, cost ~8 s CPU, 3 s of it
    importing torch and triton again)."""
    script = tmp_path_factory.mktemp("triton_fused") / "run.py"
    script.write_text(SCRIPT)
    # one intra-op thread: the run is the interpreter's Python, and torch's second thread only contended with
    # the other xdist worker (the script alone, back to back: 48.6 and 51.2 s CPU with the default threads,
    # 39.7 and 41.3 s with one; docs/timing.md "Fourth pass"). The same kernels, inputs and checks.
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(script), str(FOLDER)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _check(key: str, r: dict) -> None:
    member, dtype = key.split("/")
    loss_tol, grad_tol = TOLERANCE[dtype]
    ref = r["ref_loss"]
    for f in r["forward"]:
        assert abs(f["loss"] - ref) <= loss_tol * max(1.0, abs(ref)), (key, "no_grad forward", f, ref)
    # forward-only: one logits GEMM per chunk (two with a reference weight): 16 rows in chunks of 5 (sequence
    # level: whole sequences of 8), then one chunk of 16 (forward_rows); none where the loss does not read
    # the logits (token-is)
    per_chunk = 2 if member.endswith("ref-weight") else 1
    n_chunks = 2 if member.startswith("sequence") else 4
    # the epilogue's forward: no torch GEMM in bfloat16, one chunk of 16 rows through cuBLAS in float32
    epi = [0, 0] if member.startswith("token-is") or dtype == "bfloat16" else [per_chunk] * 2
    want = ([0, 0, 0] if member.startswith("token-is") else [per_chunk * n_chunks] * 2 + [per_chunk]) + epi
    assert [f["gemms"] for f in r["forward"]] == want, (key, r["forward"])
    names = {"hidden", "weight", "bias"} if member == "token-is-bias" else {"hidden", "weight"}
    assert len(r["calls"]) == (6 if key == "token-offpolicy-mask-kl/float32" else 3)
    for c in r["calls"]:
        assert set(c["names"]) == names, (key, c)
        assert abs(c["loss"] - ref) <= loss_tol * max(1.0, abs(ref)), (key, c)
        assert c["finite"] and c.get("masked_zero", True), (key, c)
        assert max(c["rel"].values()) < grad_tol, (key, c)
        if "second_rel" in c:
            assert max(c["second_rel"].values()) < grad_tol, (key, "second backward", c)


@pytest.mark.slow
def test_fused_kernel_matches_the_reference_quick(full):
    """float32, KL with given ref log-probs, and the upstream scalars 1, 0.25, 0.25, 1 on one plan
    (predicted right, wrong, right, wrong), after 0.37 on the accumulator's plan and before 1 on the last.
    (Its own short subprocess until 2026-12-03; now a part of the full run's.)"""
    r = full["token-offpolicy-mask-kl/float32"]
    assert [c["scale"] for c in r["calls"]] == [0.37, 1.0, 0.25, 0.25, 1.0, 1.0]
    assert [c["settings"] for c in r["calls"]] == [0, 1, 1, 1, 1, 2]
    _check("token-offpolicy-mask-kl/float32", r)


@pytest.mark.slow
def test_every_member_matches_the_reference(full):
    # One test for every member (each assertion names member/dtype): the interpreter's subprocess (~60 s
    # of CPU) ran once per xdist worker's module setup when the members were parameters (CI, 2026-12-03)
    assert set(full) - {"_epilogue"} == {f"{m}/{d}" for m in DECLARED for d in ("float32", "bfloat16")}
    for member in DECLARED:
        for dtype in ("float32", "bfloat16"):
            _check(f"{member}/{dtype}", full[f"{member}/{dtype}"])
    # the Triton GEMM of the bfloat16 accumulator: with a bias, with two weights, with sequence-level chunks
    gemm = {m for m in DECLARED if full[f"{m}/bfloat16"]["accumulate"] == "triton"}
    assert gemm == {"token-is-bias", "token-offpolicy-mask-kl-ref-weight", "sequence-offpolicy-mask"}, gemm
    for key, r in ((k, r) for k, r in full.items() if k != "_epilogue"):  # it ran there (on the accumulator's plan only), and nowhere else
        want = key.endswith("/bfloat16") and key.split("/")[0] in gemm
        assert (r["triton_gemms"][0] > 0) == want and not any(r["triton_gemms"][1:]), (key, r["triton_gemms"])


def test_declared_members_are_the_tested_ones():
    text = (FOLDER / "implementation.toml").read_text()
    import tomllib
    assert tuple(tomllib.loads(text)["members"]) == DECLARED


def _functions(path, names) -> dict:
    tree = ast.parse(path.read_text())
    return {n.name: ast.dump(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}


def test_vendored_helpers_equal_their_originals():
    """vendored.py exists because an implementation folder runs alone in the worker; a fix to the logits
    kernel's helpers must be copied here."""
    copies = _functions(FOLDER / "vendored.py", _ALL)
    originals = {**_functions(ROOT / "implementations" / "triton" / "kernels.py", _ALL),
                 **_functions(ROOT / "implementations" / "triton" / "members.py", _ALL)}
    assert set(copies) == set(_ALL)
    for name in _ALL:
        assert copies[name] == originals[name], f"vendored.py's {name} differs from implementations/triton's"


_ALL = ("_combine", "_block_update", "_chunk_stats", "_differences", "_policy_terms", "_kl_terms", "_token_terms")


def _package():
    import importlib
    import types

    pkg = types.ModuleType("grpo_impl_triton_fused_t")
    pkg.__path__ = [str(FOLDER)]
    sys.modules[pkg.__name__] = pkg
    return importlib.import_module(pkg.__name__ + ".plan"), importlib.import_module(pkg.__name__ + ".semantics")


@pytest.mark.parametrize("batch, want", [(2, "hold"), (4, "hold"), (8, "hold"), (16, "halves"), (32, "halves")])
def test_auto_weight_gradient_strategy_at_the_seed_shape(batch, want):
    """docs/fused-kernel.md's rule: hold d logits while N V 2 <= 4 V H (one float32 copy of the weight), else
    the halves accumulator (2 V H + C V 2) in chunks of 4096 rows (C <= H): the extra bytes never pass
    4 V H, and stay under 0.75 x Liger's 2.95 GiB net (fused_bench, round18e) at every batch. Forward-only
    calls keep chunks of 2048 rows whatever the strategy."""
    import torch

    plan, sem = _package()
    V, H = 128256, 4096
    s = sem.semantics_of(batch, 1024, has_old=True, has_ref=False, has_mask=True, parameters={})
    p = plan.FusedPlan(batch, 1024, H, V, torch.bfloat16, torch.device("cpu"), s, sem.FusedSettings())
    assert p.weight_grad == want
    assert p.chunk == (4096 if want == "halves" else 2048) and p.forward_chunk == 2048, (p.chunk, p.forward_chunk)
    assert p.extra_bytes() <= 4 * V * H <= 0.75 * 2.95 * 2**30
    # the accounting follows the chunk: halves = its float32 half + 4096 rows of d logits, fp32 = 2048 rows
    assert p.extra_bytes("halves") == V // 2 * H * 4 + min(4096, 1024 * batch) * V * 2
    assert p.extra_bytes("fp32") == V * H * 4 + 2048 * V * 2
    assert p.extra_bytes("halves") < p.extra_bytes("fp32") - 0.4 * 2**30
    odd = plan.FusedPlan(batch, 1024, 4095, 128255, torch.bfloat16, torch.device("cpu"), s, sem.FusedSettings())
    assert odd.weight_grad == ("hold" if batch <= 8 else "fp32")  # V H odd: no halves; the float32 buffer
    assert odd.chunk == 2048
    # an explicit chunk is every gradient call's, and the forward's unless forward_rows is given
    fixed = plan.FusedPlan(batch, 1024, H, V, torch.bfloat16, torch.device("cpu"), s, sem.FusedSettings(chunk_rows=1024))
    assert (fixed.weight_grad, fixed.chunk, fixed.forward_chunk) == (want, 1024, 1024)
    wide = plan.FusedPlan(batch, 1024, H, V, torch.bfloat16, torch.device("cpu"), s,
                          sem.FusedSettings(forward_rows=8192))
    assert wide.forward_chunk == min(8192, 1024 * batch)


def test_halves_chunk_stays_within_the_hidden_size():
    """4096-row chunks only where C V 2 <= 2 V H (C <= H); never below the general 2048 rows."""
    import torch

    plan, sem = _package()
    s = sem.semantics_of(16, 1024, has_old=True, has_ref=False, has_mask=True, parameters={})
    for hidden, want in ((1024, 2048), (3000, 3000), (4096, 4096), (8192, 4096)):
        p = plan.FusedPlan(16, 1024, hidden, 128256, torch.bfloat16, torch.device("cpu"), s,
                           sem.FusedSettings(weight_grad="halves"))
        assert p.chunk == want, (hidden, p.chunk)


def test_halves_narrow_float32_sums_in_place_and_own_exactly_the_gradients_bytes():
    """accumulator.narrow_in_place rounds each float32 value once, whatever the length (blocks double from
    n // 8), and the returned gradient of the halves accumulator is a plain [V, H] tensor over exactly
    V H 2 bytes, equal to the float32 accumulator's rounding of the same sums."""
    import importlib

    import torch

    _package()
    acc = importlib.import_module("grpo_impl_triton_fused_t.accumulator")
    g = torch.Generator().manual_seed(5)
    for n in (1, 2, 7, 8, 9, 1000, 4097, 70001):
        for dtype in (torch.bfloat16, torch.float16):
            values = torch.randn(n + n % 2, generator=g) * 3
            flat = torch.empty(2 * values.numel(), dtype=dtype)
            flat.view(torch.float32).copy_(values)
            acc.narrow_in_place(flat, n)
            assert torch.equal(flat[:n], values[:n].to(dtype)), (n, dtype)
    for vocab, hidden in ((129, 32), (17, 6), (8, 3), (1, 2)):
        a, b = acc.Halves(vocab, hidden, torch.bfloat16, "cpu"), acc.Fp32(vocab, hidden, torch.bfloat16, "cpu")
        for rows in (5, 3):
            d = torch.randn(rows, vocab, generator=g).to(torch.bfloat16)
            h = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
            a.add(d, h, "auto"), b.add(d, h, "auto")
        # the plan's memory rule (plan.extra_bytes) is the buffer the accumulator holds beside the gradient
        assert a.high.numel() * 4 == acc.Halves.extra_bytes(vocab, hidden) and a.cut == acc.Halves.low_rows(vocab)
        assert acc.Halves.fits(vocab, hidden, torch.bfloat16) and not acc.Halves.fits(vocab, hidden, torch.float32)
        got, want = a.finish(), b.finish()
        assert got.shape == (vocab, hidden) and got.is_contiguous() and got.dtype == torch.bfloat16
        assert got.untyped_storage().nbytes() == vocab * hidden * 2
        assert torch.equal(got, want), (vocab, hidden)
    with pytest.raises(ValueError, match="2-byte dtype and an even"):
        acc.Halves(3, 5, torch.bfloat16, "cpu")


def test_sequence_level_chunks_hold_whole_sequences_and_settings_are_checked():
    import torch

    plan, sem = _package()
    s = sem.semantics_of(4, 7, has_old=True, has_ref=False, has_mask=True,
                         parameters={"importance_sampling_level": "sequence"})
    for rows, want in ((5, 7), (7, 7), (20, 14), (100, 28)):
        p = plan.FusedPlan(4, 7, 8, 33, torch.float32, torch.device("cpu"), s, sem.FusedSettings(chunk_rows=rows))
        assert p.chunk == want, (rows, p.chunk)
    with pytest.raises(ValueError, match="weight_grad"):
        sem.FusedSettings(weight_grad="bf16")
    with pytest.raises(ValueError, match="forward_rows"):
        sem.FusedSettings(forward_rows=0)
    with pytest.raises(ValueError, match="forward_sweep"):
        sem.FusedSettings(forward_sweep="vector")
    with pytest.raises(ValueError, match="forward_block"):
        sem.FusedSettings(forward_block=1000)
    # the forward-only sweep: pipelined by default (block capped at the row), the gradient sweep otherwise
    p = plan.FusedPlan(4, 7, 8, 33, torch.float32, torch.device("cpu"), s, sem.FusedSettings())
    assert p.forward_sweep == dict(BLOCK=64, STAGES=3, VECTOR=True, HINTS=False)
    assert p.grad_sweep == dict(BLOCK=64, STAGES=1, VECTOR=False, HINTS=False)  # no L2 hint on the CPU
    p = plan.FusedPlan(4, 7, 8, 33, torch.float32, torch.device("cpu"), s, sem.FusedSettings(forward_sweep="plain"))
    assert p.forward_sweep == p.grad_sweep
    for rows, want in ((5, 7), (20, 14)):  # forward-only chunks hold whole sequences too
        p = plan.FusedPlan(4, 7, 8, 33, torch.float32, torch.device("cpu"), s, sem.FusedSettings(forward_rows=rows))
        assert p.forward_chunk == want, (rows, p.forward_chunk)
    with pytest.raises(ValueError, match="not implemented at sequence level"):
        sem.semantics_of(2, 3, has_old=True, has_ref=False, has_mask=False,
                         parameters={"importance_sampling_level": "sequence", "loss_type": "cispo"})
    with pytest.raises(ValueError, match="beta != 0 needs"):
        sem.semantics_of(2, 3, has_old=True, has_ref=False, has_mask=False, parameters={"beta": 0.1})


@pytest.mark.slow  # ~20 s CPU: every kernel compiled to a cubin for sm_90
def test_every_kernel_compiles_for_sm90():
    """No GPU here: the kernels must at least compile for an H200 for every switch set the launcher uses
    (benchmarks/fused_compile.py; against the H200's triton 3.6: PYTHONPATH=/tmp/site36, see its docstring).
    The d weight GEMM must come out pipelined (several stages of shared memory, not one)."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fused_compile.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900,
                         env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert run.returncode == 0, run.stderr[-3000:]
    shared = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(shared) == 117, sorted(shared)
    assert shared["acc-gemm"] >= 96 * 1024, shared["acc-gemm"]


@pytest.mark.slow
def test_epilogue_statistics_match_float64(full):
    """epilogue.py's GEMM and combine alone: with a bias, partial row and vocabulary tiles and several inner
    steps, each live row's (max, ln S, target logit) gives its float64 log-prob, and so does the log-prob
    output; masked rows (NaN hidden) come out as zeros. The bfloat16 operands are exact in float32, so what is
    left is float32 summation."""
    r = full["_epilogue"]
    assert r["tiles"] == [16, 64, 16, 5, 2], r
    assert r["triple_err"] < 2e-5 and r["logp_err"] < 2e-5 and r["target_err"] < 1e-4, r
    assert r["masked_logp"] == [0.0] * 4 and r["masked_triple"] == [0.0] * 12, r  # rows 3, 8, 13, 18
