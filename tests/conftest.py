"""Shared fixtures. Tests run on the CPU; Triton code runs under TRITON_INTERPRET=1 in workers."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["cpu_time"]  # --cpu-durations=N (tests/cpu_time.py)


def process_gone(pid: int) -> bool:
    """The process has exited (or is a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")
SPEC_FILE = ROOT / "specs" / "grpo-token-is.v1.json"
GALLERY = Path(__file__).resolve().parent / "gallery"


@pytest.fixture(scope="session")
def spec():
    from grpo_conform.spec import load_spec

    return load_spec(SPEC_FILE)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (it suffixes node ids with the group)
def pytest_collection_modifyitems(config, items):
    """Tests that share a module-scoped fixture (a worker run, a subprocess, a wheel) go to one xdist
    worker (`--dist loadgroup`, pyproject.toml), so that the fixture is built once, not once per worker;
    then the peers lane's own selection (tests/peers/peer_lane.py: deselected unless `-m peers`)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name in getattr(info, "names_closure", ()):
            defs = info.name2fixturedefs.get(name)
            if defs and defs[-1].scope == "module":
                item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{name}"))
                break
    _peers_modifyitems(config, items)


# The peers lane's hooks (tests/peers/peer_lane.py): its selection (above) and a per-member table at the end
from peers.peer_lane import pytest_collection_modifyitems as _peers_modifyitems  # noqa: E402
from peers.peer_lane import pytest_terminal_summary  # noqa: E402,F401
