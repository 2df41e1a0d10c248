"""The float64 log-probs on CUDA (grpo_conform/ops/grpo_logits/reference_kernel.py) against torch's
chunked formula (`reference.reference_logprobs` on the CPU): under TRITON_INTERPRET=1 here, on CUDA where
there is one. A kernel that rounded through float32, took T as a float32 argument, dropped the rescale of
the running sum or read the wrong target differs by far more than the 1e-13 allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

SCRIPT = r"""
import json, torch
from grpo_conform.ops.grpo_logits.reference_kernel import row_logprobs
g = torch.Generator().manual_seed(5)
out = []
for dtype, vocab, scale, temp in ((torch.float32, 3001, 2.0, 0.7), (torch.bfloat16, 4099, 3000.0, 1.0),
                                  (torch.float16, 129, 60.0, 1.3), (torch.float64, 2048, 40.0, 0.45)):
    z = (torch.randn(6, vocab, generator=g, dtype=torch.float64) * scale).clamp(-1e4, 1e4).to(dtype)
    z[2, 17] += 40  # a peaked row
    t = torch.randint(0, vocab, (6,), generator=g)
    got = row_logprobs(z, t, temp)
    want = (z.double() / temp).gather(-1, t[:, None])[:, 0] - torch.logsumexp(z.double() / temp, -1)
    out.append(float(((got - want).abs() / want.abs().clamp_min(1.0)).max()))
print(json.dumps(out))
"""


def test_the_interpreted_kernel_gives_torch_s_float64_log_probs():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(errors) <= 1e-13, errors


FLOORS = r"""
import json, torch
from grpo_conform.ops.grpo_logits.judge import row_floor_parts
g = torch.Generator().manual_seed(11)
out = []
for dtype, vocab, temp in ((torch.bfloat16, 3001, 1.0), (torch.float32, 515, 0.7), (torch.float16, 64, 1.3)):
    z = (torch.randn(7, vocab, generator=g, dtype=torch.float64) * 4).to(dtype)
    z[1, 3] = -300  # |min| above max: the maximum is of |z|
    z[2, 9] = 40 * temp  # a row its target dominates: 1 - p_t below the cap, and not 0
    z[5, 0] = float("nan")  # a poisoned last position (target -1)
    t = torch.randint(0, vocab, (7,), generator=g)
    t[2], t[5] = 9, -1
    m0, r0 = row_floor_parts(z, t, temp, kernel=False)
    m1, r1 = row_floor_parts(z, t, temp, kernel=True)
    same_max = bool(torch.equal(m0.isnan(), m1.isnan()) and torch.equal(m0.nan_to_num(), m1.nan_to_num()))
    out.append([same_max, bool(m1[5].isnan()), float((r0 - r1).abs().max()), float(r0[2] / (vocab * 2.0**-24)),
                float(r0[5])])
print(json.dumps(out))
"""


def test_the_judge_s_row_floors_from_the_kernel_are_torch_s():
    """`judge.row_floor_parts` on the kernel path (one read a row) against torch's (a float64 copy and ~9
    passes): max|z|/T the same bits (NaN where the row holds one), 1 - p_t within 1e-12 of the row scale."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", FLOORS], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for same_max, nan_row, rest_diff, peaked, last in json.loads(done.stdout.strip().splitlines()[-1]):
        assert same_max and nan_row and rest_diff <= 1e-12
        assert 0 < peaked < 0.5 and last == 0.0  # the cases exercise what they say (peaked: of the cap)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_judge_s_row_floors_on_cuda_are_the_cpu_s():
    from grpo_conform.ops.grpo_logits.judge import row_floor_parts

    g = torch.Generator().manual_seed(4)
    z = (torch.randn(64, 128256, generator=g) * 3).to(torch.bfloat16)
    z[3, :50] = -1e4
    t = torch.randint(0, 128256, (64,), generator=g)
    t[7] = -1
    m0, r0 = row_floor_parts(z, t, 0.7, kernel=False)
    m1, r1 = row_floor_parts(z.cuda(), t.cuda(), 0.7, kernel=True)
    assert torch.equal(m0, m1.cpu()) and (r0 - r1.cpu()).abs().max() <= 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reference_logprobs_on_cuda_match_the_cpu_formula():
    from grpo_conform.ops.grpo_logits import reference as ref
    from grpo_conform.ops.grpo_terms import GrpoParameters

    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 65, 128256, generator=g) * 3).to(torch.bfloat16)
    logits[0, 5, :100] = 1e4  # rows near +-1e4 (the adversarial profile's clamp)
    logits[1, -1] = float("nan")  # a poisoned last position: dropped, as on the CPU
    x = {"logits": logits, "completion_ids": torch.randint(0, 128256, (3, 64), generator=g),
         "advantages": torch.randn(3, generator=g)}
    p = GrpoParameters(epsilon_low=0.2, epsilon_high=0.2, temperature=0.7)
    want = ref.reference_logprobs(x, p)
    got = ref.reference_logprobs({k: v.cuda() for k, v in x.items()}, p).cpu()
    assert ref.kernel_reference(logits.cuda())
    assert torch.isfinite(got).all() and ((got - want).abs() / want.abs().clamp_min(1.0)).max() <= 1e-13
