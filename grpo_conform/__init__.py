"""grpo-conform: conformance checks, honest timing and signed evidence for GRPO loss kernels."""

import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    # `grpo_conform.check(...)` (the Python API: the module grpo_conform/check.py makes itself callable)
    # before anything imported the submodule: imported on first use, as `testing`, so that
    # `import grpo_conform` stays light for the CLI (check pulls torch).
    if name in ("check", "testing"):
        return importlib.import_module(f"grpo_conform.{name}")
    raise AttributeError(f"module 'grpo_conform' has no attribute {name!r}")
