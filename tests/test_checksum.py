"""The keyed checksum of kept outputs (grpo_conform/checksum.py): exact against a plain Python sum, the
same integer from the torch path and the Triton pass (interpreted here, compiled on a GPU), and changed by
any one changed byte, at the edges of blocks, slices and tensors included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_conform import checksum
from grpo_conform.checksum import MODULUS, keyed_checksum, torch_sum

ROOT = Path(__file__).resolve().parent.parent
KEY = (1_234_567_891, 987_654_321)


def python_sum(data: bytes, offset: int, k1: int, k2: int) -> int:
    return sum(b * (((offset + i) * k1 + k2) % MODULUS + 1) for i, b in enumerate(data))


def tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(37, 11, generator=g).to(torch.bfloat16), torch.randn(5000, generator=g, dtype=torch.float64),
            torch.randint(0, 255, (3,), generator=g, dtype=torch.uint8)]


def test_the_torch_path_is_the_plain_sum_exactly(monkeypatch):
    monkeypatch.setattr(checksum, "_CPU_SLICE", 100)  # several slices, one cut mid-tensor
    ts = tensors(1)
    data = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in ts)
    assert int(keyed_checksum(ts, *KEY)) == python_sum(data, 0, *KEY)
    assert int(torch_sum(torch.frombuffer(bytearray(data), dtype=torch.uint8), 12345, *KEY)) == python_sum(data, 12345, *KEY)


@pytest.mark.parametrize("where", [0, 99, 100, 813, 814, 814 + 40_000 - 1, 814 + 40_000 + 2])
def test_one_changed_byte_changes_it(monkeypatch, where):
    monkeypatch.setattr(checksum, "_CPU_SLICE", 100)
    ts = tensors(2)
    before = int(keyed_checksum(ts, *KEY))
    flat = [t.view(torch.uint8).view(-1) for t in ts]  # 814, 40,000 and 3 bytes
    for part in flat:
        if where < part.numel():
            part[where] ^= 0x01
            break
        where -= part.numel()
    assert int(keyed_checksum(ts, *KEY)) != before


def test_positions_past_four_gigabytes_do_not_overflow():
    """A gradient of 17 x 1025 x 128256 bf16 has 4.5e9 bytes (CUDA run round31c: the first version refused it)."""
    raw = torch.arange(64, dtype=torch.uint8)
    for offset in (2**32 - 7, 5 * 2**32 + 3, 2**39 - 64):
        assert int(torch_sum(raw, offset, *KEY)) == python_sum(bytes(range(64)), offset, *KEY)


@pytest.mark.parametrize("n, offset", [(1, 0), (3, MODULUS - 1), (70, MODULUS - 30), (MODULUS, 0), (MODULUS, 17),
                                       (MODULUS + 1, MODULUS - 1), (3 * MODULUS + 5, 2 * MODULUS + 9),
                                       (2 * MODULUS, 2**32 - 7), (500, 5 * 2**32 + 3)])
def test_the_weights_table_wraps_at_the_modulus(n, offset):
    """torch_sum reads a slice's weights from the key's table (one residue each, twice over): slices that start
    near the end of a period, span one exactly, or several, give the plain sum."""
    g = torch.Generator().manual_seed(n + offset % 1000)
    raw = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
    data = raw.numpy().tobytes()
    assert int(torch_sum(raw, offset, *KEY)) == python_sum(data, offset, *KEY)
    other = (KEY[0] + 2, KEY[1] + 1)  # another key: another table
    assert int(torch_sum(raw, offset, *other)) == python_sum(data, offset, *other)


def test_a_key_out_of_range_is_refused():
    with pytest.raises(ValueError, match="k1"):
        keyed_checksum([torch.zeros(3)], 0, 5)
    with pytest.raises(ValueError, match="k1"):
        keyed_checksum([torch.zeros(3)], 2**31, 5)


INTERPRETED = """
import json, sys, torch
from grpo_conform.checksum_kernel import block_sums
out = []
for n, offset, block in json.loads(sys.argv[1]):
    raw = torch.arange(n, dtype=torch.int64).mul(2654435761).remainder(256).to(torch.uint8)
    out.append(int(block_sums(raw, offset, %d, %d, block, 65521).sum()))
print(json.dumps(out))
""" % KEY


@pytest.mark.slow
def test_the_interpreted_kernel_gives_the_torch_path_s_integer():
    pytest.importorskip("triton")
    cases = [(1, 0, 16), (100, 7, 16), (4096, 0, 4096), (5000, 3_000_000_000, 1024), (4097, 2**31 + 5, 64),
             (300, 2**38, 128)]  # positions past 2^32: a 17 x 1025 x 128256 bf16 gradient has 4.5e9 bytes
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", INTERPRETED, json.dumps(cases)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for (n, offset, _), value in zip(cases, got):
        raw = torch.arange(n, dtype=torch.int64).mul(2654435761).remainder(256).to(torch.uint8)
        assert value == int(torch_sum(raw, offset, *KEY)), (n, offset)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpu_s_integer():
    ts = tensors(3) + [torch.randn(3, 1025, 4099).to(torch.bfloat16)]
    assert int(keyed_checksum([t.cuda() for t in ts], *KEY)) == int(keyed_checksum(ts, *KEY))
