"""The Python API: `grpo_conform.check(...)` runs exactly what `grpo-conform check` runs and returns
the report object (`grpo_conform.check.CheckReport`), printing nothing and exiting nothing.

    import grpo_conform
    report = grpo_conform.check("implementations/triton", device="cpu", workloads=["odd-vocab"])
    report.exit_code                    # 0 conformant, 1 a check failed, 2 usage, 3 environment
    for impl in report.implementations:  # ImplementationResult: status, message, members, workloads
        print(impl.name, impl.status)
    report.to_json()                    # what --format json prints

`grpo_conform.check` is also the module holding `run_check` and `CheckRequest`; an import hook in
grpo_conform/__init__.py makes that module callable (`make_callable`) when it loads, so both work.
"""

from __future__ import annotations

import types
from typing import Any, Iterable


def check(*paths: str, device: str = "auto", workloads: Iterable[str] = (), spec: str | None = None,
          members: Iterable[str] = (), timing: bool = True, timeout: float | None = None, **options: Any):
    """Check implementation folders against their spec; returns the `CheckReport` (never exits).

    `spec`: a spec file overriding the manifests' spec; `workloads`/`members`: run only these; `timing`:
    time the protocols on CUDA; other keyword options are `CheckRequest` fields (e.g. fail_fast=True)."""
    from grpo_conform.check import CheckRequest, run_check

    if not paths:
        raise TypeError("grpo_conform.check() needs at least one implementation folder")
    request = CheckRequest(paths=tuple(str(p) for p in paths), device=device, workloads=tuple(workloads),
                           spec_path=spec, timing=timing, timeout=timeout, members=tuple(members), **options)
    return run_check(request)


class _CallableModule(types.ModuleType):
    def __call__(self, *paths: str, **options: Any):
        return check(*paths, **options)


def make_callable(module: types.ModuleType) -> None:
    """Let `grpo_conform.check(...)` call `check` above while `grpo_conform.check` stays the module."""
    if not isinstance(module, _CallableModule):
        module.__class__ = _CallableModule
