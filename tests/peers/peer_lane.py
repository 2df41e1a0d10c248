"""The peers lane (issue 33 item 3): the trainers' own loss functions against the float64 reference.

Not a conftest.py: the suite imports `from conftest import ...` (tests/conftest.py), which a second
conftest module would shadow; tests/conftest.py imports the two hooks below instead.

Tests marked `peers` are deselected unless the lane is selected (`pytest -m peers`, .ci/run's third lane):
importing TRL alone takes 10-25 s here, which the other lanes must not pay. Each trainer's tests skip
with the reason when its optional extra is missing (`pip install -e '.[peers]'`; verl's light install
is in docs/spec-family.md). The terminal summary prints one line per trainer route and member.
"""

from __future__ import annotations

import importlib.util

import pytest

# Optional extra per trainer route: the module whose absence skips the route.
EXTRAS = {"trl": "trl", "liger-torch": "liger_kernel", "liger-fused": "liger_kernel",
          "verl": "verl.trainer.ppo.core_algos"}
RESULTS: dict[tuple[str, str], str] = {}


def reference():
    """The float64 reference module (the one line to change when it moves to grpo_conform/ops/grpo_logits/)."""
    from grpo_conform.ops.grpo_logits import reference as module

    return module


def require(route: str) -> None:
    """Skip unless the route's trainer imports (verl: its import chain, ray, tensordict and more, too)."""
    name = EXTRAS[route]
    try:
        found = importlib.util.find_spec(name.split(".")[0]) is not None
        if found and "." in name:
            importlib.import_module(name)
    except Exception as exc:  # a partial install (verl without ray, say) skips like a missing one
        pytest.skip(f"{route}: {name} does not import ({type(exc).__name__}: {exc}); see docs/spec-family.md")
    if not found:
        pytest.skip(f"{route}: {name} is not installed (pip install -e '.[peers]'; verl: docs/spec-family.md)")


def pytest_collection_modifyitems(config, items):
    """Deselect (reported as "deselected") the peers tests unless the marker expression names peers."""
    if "peers" in (config.getoption("markexpr") or ""):
        return
    lane = [item for item in items if item.get_closest_marker("peers") is not None]
    if lane:
        config.hook.pytest_deselected(items=lane)
        items[:] = [item for item in items if item.get_closest_marker("peers") is None]


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    terminalreporter.section("peers: trainer route x member")
    for (route, member), outcome in sorted(RESULTS.items()):
        terminalreporter.write_line(f"{route:12} {member:28} {outcome}")
