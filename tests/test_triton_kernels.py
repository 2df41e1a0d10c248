"""The bundled Triton kernels under TRITON_INTERPRET=1, launcher by launcher, against the float64
reference. They run in a subprocess: the variable must be set before triton is imported, and the
implementation folder is loaded as a package the way the worker loads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("triton", reason="the Triton implementation needs triton (pip install 'grpo-conform[triton]')")

TRITON_FOLDER = ROOT / "implementations" / "triton"

SCRIPT = r'''
"""Run every launcher path of implementations/triton on small problems; print one JSON object."""
import importlib, json, math, sys, types
from dataclasses import replace

import torch

from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss

folder = sys.argv[1]
package = "grpo_impl_triton"
pkg = types.ModuleType(package)
pkg.__path__ = [folder]
pkg.__package__ = package
sys.modules[package] = pkg
launch = importlib.import_module(package + ".launch")
assert launch.interpreting()

PARAMS = GrpoParameters(0.2, 0.2, 1.0)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
B, S, V = 2, 3, 3001


def inputs(dtype):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(B, S + 1, V, generator=g) * 2
    ids = torch.randint(0, V, (B, S), generator=g)
    ids[0, 0], ids[1, S - 1] = 0, V - 1  # both ends of the vocabulary
    logits[1, 0] = logits[1, 0] * 3000 / 2  # a row of large logits (overflows exp without max subtraction)
    logits[1, 0].clamp_(-1e4, 1e4)
    logits[0, 1, ids[0, 1]] += 30.0  # a near one-hot row
    # A Student-t row of the spec: two tied logits far above the rest (p = 1/2 each). At this
    # magnitude one fp32 lse = max + ln S is rounded by ~0.03, i.e. 3% of each p.
    huge = 60000.0 if dtype == "float16" else 413696.0
    logits[1, 2, 7] = logits[1, 2, 2900] = huge
    logits = logits.to(DTYPES[dtype])
    logits[:, S, :] = float("nan")  # the last position is never read
    adv = torch.tensor([-0.7, 1.2])
    return logits, ids, adv


def poison():
    """Leave NaN in freed heap blocks, so a gradient element nobody writes shows up."""
    sizes = (2, 4, 6, 8, 16, 32, 64, 128, 512, 2048, 6000, 12000, 24008, 48016, 100000)
    blocks = [torch.full((n,), float("nan"), dtype=torch.float32) for n in sizes for _ in range(2)]
    del blocks


def grad_metrics(grad, ref, last_ok=True):
    g = grad.double()
    finite = bool(torch.isfinite(g[:, :S]).all())
    diff = torch.where(torch.isfinite(g), g - ref, torch.full_like(g, math.inf))
    frob = float(diff[:, :S].norm() / ref.norm()) if finite else math.inf
    last = grad[:, S, :]
    worst = float(diff[:, :S].abs().max() / ref.abs().max()) if finite else math.inf
    return {"frob": frob, "worst": worst, "finite": finite, "last_zero": bool((last == 0).all()),
            "last_nonzero": int((last != 0).sum()), "dtype": str(grad.dtype).replace("torch.", ""),
            "shape": list(grad.shape)}


def loss_metrics(loss, ref):
    return {"loss": float(loss), "ref_loss": ref, "loss_dtype": str(loss.dtype).replace("torch.", ""),
            "loss_shape": list(loss.shape)}


results = {}
base = launch.settings_for(V, torch.device("cpu"))
results["settings"] = {"fused": base.fused, "chunk": base.chunk, "forward_chunk": base.forward_chunk}

for dtype in DTYPES:
    logits, ids, adv = inputs(dtype)
    pristine = logits.clone()
    p = launch.Problem.of(logits, 0.2, 0.2, 1.0)
    ref = reference_gradient_dense(logits, ids, adv, PARAMS)
    ref_loss = reference_loss(logits, ids, adv, PARAMS)
    forward = [(0, 256, True), (0, 4096, False), (1024, 512, False), (1024, 1024, True), (4096, 1024, True),
               (512, 512, True)] if dtype == "bfloat16" else [(0, 256, True), (4096, 4096, True)]
    for chunk, block, vector in forward:
        s = replace(base, forward_chunk=chunk, forward_block=block, forward_vector=vector)
        poison()
        loss = launch.forward_loss(logits, ids, adv, p, s)
        results[f"{dtype}/forward/chunk={chunk}/block={block}/vector={vector}"] = loss_metrics(loss, ref_loss)
    fused = [("split", dict(block=1024, vector=True, hints=True)), ("split", dict(block=4096, vector=False, hints=False)),
             ("sync", dict(stream_stores=True)), ("sync", dict(stream_stores=False)),
             ("two_sweep", dict(block=1024, vector=True, hints=True)),
             ("two_sweep", dict(block=512, vector=False, hints=False))]
    if dtype != "bfloat16":
        fused = fused[:1] + fused[2:3] + fused[4:5]
    for kind, extra in fused:
        s = replace(base, fused=kind, chunk=4096, **extra)
        poison()
        loss, grad, stats = launch.fused_loss_and_grad(logits, ids, adv, p, s)
        lse = launch.lse_of(stats, p)
        name = f"{dtype}/fused={kind}/" + "/".join(f"{k}={v}" for k, v in extra.items())
        z = logits[:, :S].double()
        lse_ref = torch.logsumexp(z, -1).reshape(-1)
        results[name] = {**loss_metrics(loss, ref_loss), **grad_metrics(grad, ref),
                         "lse_err": float(((lse.double() - lse_ref).abs() / lse_ref.abs().clamp_min(1)).max())}
        if kind == "split" and extra["block"] == 1024:
            saved_grad, saved_stats = grad, stats
    # A second backward: the gradient again from the saved lse, times d loss, in several chunks per row.
    for block in (1024, 4096):
        s = replace(base, forward_block=block)
        poison()
        grad = launch.grad_from_stats(logits, ids, adv, saved_stats, torch.tensor(2.0), p, s)
        results[f"{dtype}/grad_from_stats/dloss=2/block={block}"] = grad_metrics(grad, 2 * ref)
    # d loss != 1 scales in place; d loss == 1 must leave the buffer bitwise unchanged.
    for scale in (-3.0, 1.0, 0.5):
        buf = saved_grad.clone()
        before = buf.clone()
        ptr = buf.data_ptr()
        launch.scale_in_place(buf, torch.tensor(scale))
        width = {2: torch.int16, 4: torch.int32}[buf.element_size()]
        expected = (before.float() * scale).to(buf.dtype)
        results[f"{dtype}/scale/{scale}"] = {
            "same_address": buf.data_ptr() == ptr,
            "bitwise_unchanged": bool(torch.equal(buf.view(width), before.view(width))),
            "equals_multiplied": bool(torch.equal(buf.view(width), expected.view(width))),
            "rel_to_product": float(((buf.double() - before.double() * scale).abs()
                                     / (before.double() * scale).abs().clamp_min(1e-300)).max()),
            **grad_metrics(buf, scale * ref)}
    results[f"{dtype}/inputs_unchanged"] = bool(torch.equal(
        logits.view(torch.int16 if logits.element_size() == 2 else torch.int32),
        pristine.view(torch.int16 if logits.element_size() == 2 else torch.int32)))

# impl.grpo_loss (plans, members, the gradient-mode choice) is tested in tests/test_triton_members.py.
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    script = tmp_path_factory.mktemp("triton") / "run_kernels.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1", MALLOC_MMAP_THRESHOLD_=str(1 << 32),
               MALLOC_TRIM_THRESHOLD_=str(1 << 36))
    run = subprocess.run([sys.executable, str(script), str(TRITON_FOLDER)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


TOLERANCE = {"bfloat16": 1e-2, "float16": 1e-2, "float32": 1e-5}
WORST = {"bfloat16": 2 ** -7, "float16": 2 ** -9, "float32": 1e-5}


def _keys(results, prefix):
    keys = [k for k in results if k.startswith(prefix)]
    assert keys, f"nothing ran for {prefix}"
    return keys


def _loss_ok(r):
    assert r["loss_shape"] == [] and r["loss_dtype"] == "float32"
    assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * max(1.0, abs(r["ref_loss"])), r


def _grad_ok(r, dtype, name):
    assert r["finite"], name
    assert r["last_zero"], f"{name}: {r['last_nonzero']} non-zero elements at the last position"
    assert r["dtype"] == dtype and r["shape"] == [2, 4, 3001]
    assert r["frob"] < TOLERANCE[dtype], f"{name}: relative Frobenius error {r['frob']:.3g}"
    # Element by element, against the largest gradient element: one rounding of the logits dtype.
    assert r["worst"] < WORST[dtype], f"{name}: worst element off by {r['worst']:.3g} of the largest"


@pytest.mark.slow
def test_the_interpreter_runs_one_chunk_per_row(results):
    assert results["settings"] == {"fused": "split", "chunk": 4096, "forward_chunk": 4096}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_forward_loss_every_split(results, dtype):
    keys = _keys(results, f"{dtype}/forward/")
    if dtype == "bfloat16":
        # auto split (several chunks), one chunk, and chunks smaller than the vocabulary (last arriver combines)
        assert len(keys) == 6 and any("chunk=0/block=256" in k for k in keys)
        assert any("chunk=512" in k for k in keys) and any("vector=False" in k for k in keys)
    for k in keys:
        _loss_ok(results[k])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_fused_loss_and_grad_every_kernel(results, dtype):
    keys = _keys(results, f"{dtype}/fused=")
    assert {k.split("/")[1] for k in keys} == {"fused=split", "fused=sync", "fused=two_sweep"}
    for k in keys:
        r = results[k]
        _loss_ok(r)
        _grad_ok(r, dtype, k)
        assert r["lse_err"] < (1e-6 if dtype == "float32" else 1e-5), k


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_grad_from_stats_scales_by_dloss(results, dtype):
    for k in _keys(results, f"{dtype}/grad_from_stats/"):
        _grad_ok(results[k], dtype, k)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_scale_in_place(results, dtype):
    one = results[f"{dtype}/scale/1.0"]
    assert one["same_address"] and one["bitwise_unchanged"]
    for scale in ("-3.0", "0.5"):
        r = results[f"{dtype}/scale/{scale}"]
        assert r["same_address"] and not r["bitwise_unchanged"]
        if dtype == "bfloat16":
            # The interpreter converts float32 to bfloat16 by truncation (a GPU rounds to nearest even):
            # within one bf16 step of the float32 product, not necessarily the nearest value.
            assert r["rel_to_product"] < 2**-7, r["rel_to_product"]
        else:
            assert r["equals_multiplied"], f"{dtype} x {scale}: not the fp32 product rounded to {dtype}"
        _grad_ok(r, dtype, f"scale {scale}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_launchers_leave_the_inputs_unchanged(results, dtype):
    assert results[f"{dtype}/inputs_unchanged"] is True
