"""isolation/compile_only.py with the real Triton JIT on CUDA: inside the block a launch compiles and does not
run, leaving the block waits for the compile, and after it the same launch finds the kernel and runs. Needs a
GPU and Triton with AsyncCompileMode."""

from __future__ import annotations

import pytest
import torch

from grpo_conform.isolation import compile_only

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _kernel():
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):  # defined per test: a fresh in-process cache
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

    return add_one


def test_a_launch_inside_compiles_without_running_and_runs_after():
    kernel = _kernel()
    x = torch.zeros(1000, device="cuda")
    with compile_only.side_by_side(2) as active:
        if not active:
            pytest.skip("this Triton has no AsyncCompileMode")
        kernel[(4,)](x, 1000, BLOCK=256)
    torch.cuda.synchronize()
    assert int(x.sum()) == 0  # compiled, not run
    kernel[(4,)](x, 1000, BLOCK=256)
    torch.cuda.synchronize()
    assert int(x.sum()) == 1000  # outside the block the launch runs, from the kernel compiled inside
