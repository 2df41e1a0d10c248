"""implementations/triton/sequences.py: the kernels that reduce over sequences hold BLOCK_B sequences a
tile. Every tile height must give the same per-sequence weights and sampling ratios (against torch),
and the same loss and per-token coefficients as the whole batch in one tile (the interpreter's launch,
which test_triton_members.py checks against the float64 reference). Batch 5 with a sequence longer
than BLOCK_T: heights 1, 2 and 4 leave a partial last tile and several time blocks. Under
TRITON_INTERPRET=1 in one subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("triton", reason="the Triton implementation needs triton")

SCRIPT = r'''
import importlib, json, sys, types
import torch
pkg = types.ModuleType("grpo_impl_triton_n"); pkg.__path__ = [sys.argv[1]]; sys.modules[pkg.__name__] = pkg
seqk = importlib.import_module(pkg.__name__ + ".sequences")
B, S, BT = 5, 11, 4
g = torch.Generator().manual_seed(3)
mask = (torch.rand(B, S, generator=g) < 0.7).to(torch.int64)
mask[1] = 0  # a fully masked sequence
mask[3, :] = 1
rho = 0.5 + torch.rand(B, S, generator=g)
adv = torch.randn(B, generator=g)
T = B * S
ws0 = torch.zeros(7 * T + 2)
ws0[2 * T:3 * T] = -torch.rand(T, generator=g) * 3  # logp
ws0[5 * T:6 * T] = 0.3 * torch.randn(T, generator=g)  # logp - old
ws0[6 * T:7 * T] = 0.3 * torch.randn(T, generator=g)  # ref - logp
n = mask.sum(1).double()
out = {"norm": {}, "terms": {}}
for glob in (False, True):
    want_w = (1.0 / n.sum().clamp(min=1)).expand(B) if glob else 1.0 / (B * n.clamp(min=1))
    want_r = torch.exp((mask * rho.double().log()).sum(1))
    for bb in (1, 2, 4, 8):
        wb, rb = torch.full((B,), -1.0), torch.full((B,), -1.0)
        seqk._norm_kernel[(1,)](mask, rho, wb, rb, B, S, GLOBAL=glob, WRITE_W=True, SEQ_RHO=True, HAS_MASK=True,
                                BLOCK_T=BT, BLOCK_B=bb)
        out["norm"][f"{glob}-{bb}"] = [float((wb.double() - want_w).abs().max() / want_w.abs().max()),
                                       float((rb.double() - want_r).abs().max() / want_r.abs().max())]
OFF = dict(HAS_OLD=True, HAS_KL=False, HAS_MASK=True, HAS_RHO=False, HAS_DELTA=False, HAS_CAP=False, CISPO=False,
           KL_BC=False, RHO_MASK=False, SEQ_RHO=False, SAPO=False, NEEDS_LOGP=True, NORM=1, SEQUENCE=False,
           VESPO=False)
CASES = {"gspo": dict(SEQUENCE=True), "gspo-kl": dict(SEQUENCE=True, HAS_KL=True),
         "vespo": dict(VESPO=True, HAS_RHO=True, HAS_CAP=True, NORM=0), "dapo": dict(NORM=2, HAS_KL=True),
         "vllm-sequence-mask": dict(HAS_RHO=True, HAS_CAP=True, RHO_MASK=True, SEQ_RHO=True)}
for name, sw in CASES.items():
    k = dict(OFF, **sw)
    rb = torch.empty(B)
    if k["SEQ_RHO"]:
        seqk._norm_kernel[(1,)](mask, rho, torch.empty(B), rb, B, S, GLOBAL=False, WRITE_W=False, SEQ_RHO=True,
                                HAS_MASK=True, BLOCK_T=BT, BLOCK_B=2)
    res = {}
    for bb in (8, 1, 2, 4):
        ws, loss = ws0.clone(), torch.zeros(())
        seqk._terms_kernel[(1,)](ws, adv, ws, ws, mask, rho, rb, loss, B, S, T, 1.25, 0.0, 0.2, 0.28, 1.5, 0.05,
                                 1.3, 1.0 / 7, 2.0, 1.5, 1.0, 2.5, WRITE_COEF=True, BLOCK_T=BT, BLOCK_B=bb, **k)
        res[bb] = (float(loss), ws[3 * T:4 * T].clone())
    out["terms"][name] = {bb: [res[bb][0], res[8][0], bool(torch.equal(res[bb][1], res[8][1])),
                               bool((res[bb][1] != 0).any())] for bb in (1, 2, 4)}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def tiled():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "implementations" / "triton")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_tile_height_gives_the_weights_and_sequence_ratios_torch_gives(tiled):
    assert len(tiled["norm"]) == 8
    for key, (w_err, r_err) in tiled["norm"].items():
        assert w_err < 1e-6 and r_err < 1e-5, key


@pytest.mark.parametrize("case", ["gspo", "gspo-kl", "vespo", "dapo", "vllm-sequence-mask"])
def test_every_tile_height_gives_the_loss_and_coefficients_of_one_tile(tiled, case):
    for bb, (loss, whole, same_coef, coef_nonzero) in tiled["terms"][case].items():
        assert loss == pytest.approx(whole, rel=1e-5, abs=1e-7), (case, bb)
        assert same_coef and coef_nonzero, (case, bb)
