"""isolation/compile_only.py: the compile-ahead worker's launches made compile-only warm-ups on a thread pool
(Triton's AsyncCompileMode), and nothing changed where that cannot be; check_ahead's thread count. On a GPU
the compile-ahead worker is the only one to enter it (tests/test_check_ahead.py)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from grpo_conform import check_ahead
from grpo_conform.errors import EnvironmentProblem
from grpo_conform.isolation import compile_only


class _FakeJIT:
    calls: list = []

    def run(self, *args, grid, warmup, **kwargs):
        _FakeJIT.calls.append((args, grid, warmup, kwargs))
        return "kernel"


class _FakeMode:
    entered: list = []

    def __init__(self, executor, *, ignore_errors=False):
        self.executor, self.ignore_errors = executor, ignore_errors

    def __enter__(self):
        _FakeMode.entered.append(self)
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_triton(monkeypatch):
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = _FakeJIT
    mode = types.ModuleType("triton.runtime._async_compile")
    mode.AsyncCompileMode = _FakeMode
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    monkeypatch.setitem(sys.modules, "triton.runtime._async_compile", mode)
    monkeypatch.setattr(_FakeJIT, "calls", [])
    monkeypatch.setattr(_FakeMode, "entered", [])
    return _FakeJIT


def test_a_launch_inside_is_a_warm_up_on_the_pool_and_the_jit_is_restored_after(fake_triton):
    original = fake_triton.__dict__["run"]
    with compile_only.side_by_side(3) as active:
        assert active
        assert fake_triton().run(1, 2, grid=(4,), warmup=False, num_warps=8) == "kernel"
        (mode,) = _FakeMode.entered
        assert mode.ignore_errors and mode.executor._max_workers == 3
    assert fake_triton.calls == [((1, 2), (4,), True, {"num_warps": 8})]  # compiled, never launched
    assert fake_triton.__dict__["run"] is original  # after the block a launch runs again
    fake_triton().run(grid=(1,), warmup=False)
    assert fake_triton.calls[-1][2] is False
    assert mode.executor._shutdown


def test_an_inherited_run_is_inherited_again_after(fake_triton, monkeypatch):
    class Child(_FakeJIT):
        pass

    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = Child
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    with compile_only.side_by_side(2):
        Child().run(grid=(1,), warmup=False)
        assert "run" in Child.__dict__
    assert "run" not in Child.__dict__ and Child.run is _FakeJIT.run
    assert _FakeJIT.calls[0][2] is True


def test_a_triton_whose_mode_has_no_ignore_errors_is_used_as_it_is(fake_triton, monkeypatch):
    class OldMode(_FakeMode):
        def __init__(self, executor):
            super().__init__(executor)

    module = types.ModuleType("triton.runtime._async_compile")
    module.AsyncCompileMode = OldMode
    monkeypatch.setitem(sys.modules, "triton.runtime._async_compile", module)
    with compile_only.side_by_side(2) as active:
        assert active and isinstance(_FakeMode.entered[0], OldMode)


def test_the_jit_is_restored_when_the_calls_raise(fake_triton):
    original = fake_triton.__dict__["run"]
    with pytest.raises(ZeroDivisionError):
        with compile_only.side_by_side(2):
            1 / 0
    assert fake_triton.__dict__["run"] is original


def test_nothing_changes_without_threads_triton_s_jit_or_its_async_mode(fake_triton, monkeypatch):
    original = fake_triton.__dict__["run"]
    with compile_only.side_by_side(0) as active:
        assert not active and fake_triton.__dict__["run"] is original
    monkeypatch.setitem(sys.modules, "triton.runtime._async_compile", types.ModuleType("empty"))
    with compile_only.side_by_side(4) as active:  # a Triton without AsyncCompileMode
        assert not active and fake_triton.__dict__["run"] is original
    monkeypatch.delitem(sys.modules, "triton.runtime.jit")
    with compile_only.side_by_side(4) as active:  # the implementation never imported Triton's JIT
        assert not active
    assert _FakeMode.entered == []


@pytest.mark.parametrize("raw, count", [(None, 0), ("", 0), ("0", 0), ("8", 8), (" 16 ", 16)])
def test_the_thread_count_is_read_from_the_environment(monkeypatch, raw, count):
    if raw is None:
        monkeypatch.delenv(check_ahead.ENV_THREADS, raising=False)
    else:
        monkeypatch.setenv(check_ahead.ENV_THREADS, raw)
    assert check_ahead.threads() == count


@pytest.mark.parametrize("raw", ["eight", "-1", "65", "2.5"])
def test_a_malformed_thread_count_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv(check_ahead.ENV_THREADS, raw)
    with pytest.raises(EnvironmentProblem, match="GRPO_CONFORM_COMPILE_AHEAD_THREADS"):
        check_ahead.threads()


REAL = r'''
import os, sys, types
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class NoGpu:
    """A driver that names an sm_90 target and cannot launch: compiling works, running would raise."""
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")
    def is_active(self): return True

driver.set_active(NoGpu())
sys.path.insert(0, sys.argv[1])
pkg = types.ModuleType("impl_triton")
pkg.__path__ = [os.path.join(sys.argv[1], "implementations", "triton")]
sys.modules["impl_triton"] = pkg
from impl_triton.impl import grpo_loss
from grpo_conform.isolation.compile_only import side_by_side
from triton.runtime.jit import JITFunction

x = torch.randn(2, 9, 256).to(torch.bfloat16).requires_grad_(True)
ids, adv = torch.randint(0, 256, (2, 8)), torch.randn(2)
old, mask = torch.randn(2, 8) - 5, torch.ones(2, 8, dtype=torch.int32)
original = JITFunction.run
with side_by_side(2) as active:
    assert active
    with torch.no_grad():
        grpo_loss(x, ids, adv, old_logprobs=old, completion_mask=mask)
    grpo_loss(x, ids, adv, old_logprobs=old, completion_mask=mask).backward()
assert JITFunction.run is original
try:
    grpo_loss(x, ids, adv, old_logprobs=old, completion_mask=mask)
except AttributeError as exc:  # outside the block a launch runs, and this driver cannot
    print("launch outside refused:", "launcher" in str(exc))
cubins = [f for _, _, files in os.walk(os.environ["TRITON_CACHE_DIR"]) for f in files if f.endswith(".cubin")]
print("cubins", len(cubins))
'''


@pytest.mark.slow  # ~5-10 s on 2 cores: Triton compiles a member's kernels for sm_90
def test_real_triton_compiles_our_kernels_for_sm90_without_running_them(tmp_path):
    """With Triton's own JIT and AsyncCompileMode (no fakes of ours), implementations/triton's forward and backward
    inside the block compile for an sm_90 target on a 2-thread pool; a driver that cannot launch proves nothing ran,
    and the JIT launches again after the block."""
    pytest.importorskip("triton.backends.nvidia")
    import subprocess

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(root))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", REAL, str(root)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "launch outside refused: True" in proc.stdout
    count = int(proc.stdout.split("cubins")[-1])
    assert count >= 4, proc.stdout  # the statistics, terms and gradient kernels of a masked member at least
