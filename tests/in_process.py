"""Judging an eager implementation's call in this process, as the validator judges a worker's: for tests that
sample many drawn sets (thousands of seeds) where a worker per set would cost seconds each. Shared by
test_judged_rows, test_small_advantages, test_live_sequences and test_fp32_logprob."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any, Callable

from grpo_conform.checks.conformance import Call, WorkloadConformance


def load_module(path: Path, name: str) -> Any:
    """The Python file at `path` imported as module `name` (an implementation's impl.py, a gallery folder's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def judge(run: WorkloadConformance, x: dict, grpo_loss: Callable[..., Any]) -> tuple[bool, bool]:
    """(loss passed, gradient passed) of `grpo_loss` on the set `x` (its logits a fresh leaf, the run's drawn
    parameters), judged as call A against the float64 reference."""
    leaf = x["logits"].detach().clone().requires_grad_(True)
    loss = grpo_loss(leaf, **{k: v for k, v in x.items() if k != "logits"}, **run.model.call_values)
    loss.backward()
    call = Call("A#1", types.SimpleNamespace(pristine=x), 1.0, float(loss.detach()), {}, {"logits": {}},
                {"logits": leaf.grad}, None)
    loss_cmp, cmp = run.judge(call)
    return loss_cmp.passed, cmp.passed
