"""The logits' draw on CUDA (grpo_conform/ops/grpo_logits/generators/logits_kernel.py), run here under
TRITON_INTERPRET=1 on the CPU in one subprocess: each profile's distribution (scale, clamp, spike at the
target, Student-t's tails), the dtype's limit, determinism by seed, and rows that differ from each other.
A draw that ignored a row's profile, put the spike elsewhere, dropped a clamp or repeated rows fails here;
`fill_logits` on CUDA (the H200 test at the end) must draw every set through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

SCRIPT = r"""
import json, math, torch
from grpo_conform.spec import find_spec
from grpo_conform.ops.grpo_logits.generators.logits_kernel import fill_rows, profile_table
spec = find_spec("grpo/token-is")
names = ["normal", "wide", "large", "peaked", "heavy_tailed"]
profiles = [spec.validation.profile(n) for n in names]
table = profile_table(profiles, "cpu")
rows, vocab = 10, 3001  # two rows a profile; a partial last block
order = torch.tensor([0, 1, 2, 3, 4] * 2, dtype=torch.int32)
target = torch.tensor([-1, -1, -1, 17, -1, -1, -1, -1, 2999, -1])
out = {}
for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
    limit = torch.finfo(dtype).max / 4
    a = torch.empty(rows, vocab, dtype=dtype); fill_rows(a, order, target, table, 1234, limit)
    b = torch.empty(rows, vocab, dtype=dtype); fill_rows(b, order, target, table, 1234, limit)
    c = torch.empty(rows, vocab, dtype=dtype); fill_rows(c, order, target, table, 1235, limit)
    x = a.float()
    kurt = lambda r: float(((r - r.mean()) ** 4).mean() / r.var() ** 2)
    out[name] = {"same_seed": bool(torch.equal(a, b)), "other_seed_differs": bool((a != c).float().mean() > 0.99),
                 "std": [float(x[r].std()) for r in range(rows)], "absmax": [float(x[r].abs().max()) for r in range(rows)],
                 "argmax": [int(x[r].argmax()) for r in range(rows)], "kurtosis": [kurt(x[r]) for r in range(rows)],
                 "rows_distinct": len({tuple(x[r, :8].tolist()) for r in range(rows)}) == rows, "limit": limit,
                 "finite": bool(torch.isfinite(x).all())}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def drawn():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_each_row_follows_its_profile(drawn, dtype):
    d = drawn[dtype]
    assert d["same_seed"] and d["other_seed_differs"] and d["rows_distinct"] and d["finite"]
    std, absmax, argmax, kurt = d["std"], d["absmax"], d["argmax"], d["kurtosis"]
    for r in (0, 5):  # normal: N(0, 2)
        assert 1.85 < std[r] < 2.15 and kurt[r] < 4
    for r in (1, 6):  # wide: N(0, 60)
        assert 55 < std[r] < 65
    for r in (2, 7):  # large: N(0, 3000) clamped to +-1e4 (float16: to its max / 4 = 16376 first, then 1e4)
        assert absmax[r] == pytest.approx(1e4, rel=1e-2) and 2500 < std[r] < 3200
    assert argmax[3] == 17 and argmax[8] == 2999  # peaked: the spike at the row's target
    for r in (3, 8):  # N(0, 1) plus a spike of 40: the spike is the row's max
        assert 37 < absmax[r] < 46 and 0.9 < std[r] < 1.6
    for r in (4, 9):  # Student-t, 2 degrees of freedom: far heavier tails than a normal
        assert kurt[r] > 10 and absmax[r] > 15 * 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fill_logits_on_cuda_draws_through_the_kernel_and_keeps_each_row_s_profile(monkeypatch):
    from grpo_conform.ops.grpo_logits import inputs
    from grpo_conform.ops.grpo_logits.generators import logits_kernel
    from grpo_conform.spec import find_spec

    calls = []
    real = logits_kernel.fill_rows
    monkeypatch.setattr(logits_kernel, "fill_rows", lambda *a, **k: (calls.append(a), real(*a, **k))[1])
    spec = find_spec("grpo/token-is")
    logits = torch.empty(4, 65, 128256, dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(0, 128256, (4, 64), device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(7)
    inputs.fill_logits(logits, ids, spec, spec.validation.base_profiles, gen)
    assert len(calls) == 1
    order = calls[0][1].view(4, 65)
    peaked = [k for k, n in enumerate(spec.validation.base_profiles) if spec.validation.profile(n).kind == "peaked"]
    rows = (order[:, :64] == peaked[0]).nonzero().tolist() if peaked else []
    for b, t in rows[:20]:  # a peaked scored row spikes at its completion id
        assert int(logits[b, t].float().argmax()) == int(ids[b, t])
    assert torch.isfinite(logits.float()).all()
