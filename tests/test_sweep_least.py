"""benchmarks/sweep_least.py (issue 36) without a GPU: the least call's pass under TRITON_INTERPRET=1 moves what a
member must move (kept rows copied, masked rows and each sequence's last row written as zeros, never read), and
its self-check refuses a pass that does not; the least autograd call hands over d loss times the logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1] + "/benchmarks"); sys.path.insert(0, sys.argv[1])
import torch
import grpo_conform.timing as timing
timing.time_cuda = lambda fn, reps, warmup, **_: [(fn(), 1000)[1]] * reps  # the interpreter has no events: 1 us
import sweep_least as sl
out = {}
mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
for vocab in (5, 300, 8192, 8200, 20000):  # under, at and past one block; a block spanning two rows
    x = (torch.randn(2, 4, vocab) + 3).to(torch.bfloat16)  # no zero: a zero written and a zero copied differ
    keep = sl.row_keep(mask)
    dst = torch.full_like(x, 7.0)
    sl.least_pass(x, dst, keep)
    rows = keep.bool().view(2, 4)
    out[vocab] = {"block": sl.block_for(vocab), "kept": torch.equal(dst[rows], x[rows]),
                  "zeros": not dst[~rows].any(), "rows": rows.tolist()}
adv = torch.tensor([0.5, -1.5])
out["least_ms"] = sl.least_ms(x, adv, mask, True, reps=3, warmup=0)
out["plain"] = sl.least_ms(x, adv, mask, False, reps=3, warmup=0)
real = sl.least_pass
sl.least_pass = lambda x, dst, keep: dst.copy_(x)  # reads and copies the masked rows too: what a member need not
try:
    sl.least_ms(x, adv, mask, True, reps=3, warmup=0)
    out["refused"] = False
except sl.LeastPassWrong as exc:
    out["refused"] = str(exc)
sl.least_pass = real
call = sl.least_autograd_call(x.float(), adv)
call()
call()  # twice: the gradient is handed over each time, never accumulated
out["call"] = True
print(json.dumps(out))
"""


@pytest.mark.slow  # ~10 s: the interpreter runs five vocabularies' passes
def test_the_least_pass_moves_what_a_masked_member_must_and_its_check_refuses_a_plain_copy(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), SWEEP_DEVICE="cpu")
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for vocab in ("5", "300", "8192", "8200", "20000"):
        rec = out[vocab]
        assert rec["kept"] and rec["zeros"], (vocab, rec)
        assert rec["block"] <= int(vocab)  # a block spans two rows at most
    assert out["300"]["rows"] == [[True, False, True, False], [False, False, True, False]]  # last rows: no token
    assert set(out["least_ms"]) == {"least_ms", "least_pass_ms", "least_passes_ms"}
    assert set(out["least_ms"]["least_passes_ms"]) == {"triton"} and set(out["plain"]["least_passes_ms"]) == {"triton",
                                                                                                             "copy_"}
    assert out["refused"] and "kept rows" in out["refused"]
    assert out["call"]
