"""Where a result came from: versions, the GPU and driver, the project's git commit, UTC time."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import grpo_conform

PROJECT_ROOT = Path(grpo_conform.__file__).resolve().parent.parent


def utc_now() -> str:
    """RFC 3339 UTC with a Z, to the second."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


ENV_COMMIT, ENV_DIRTY = "GRPO_CONFORM_GIT_COMMIT", "GRPO_CONFORM_GIT_DIRTY"


def git_state() -> dict[str, Any]:
    """The checkout's commit and dirtiness; where the tree was copied (a GPU machine), whoever copied
    it says which commit it was in $GRPO_CONFORM_GIT_COMMIT / $GRPO_CONFORM_GIT_DIRTY."""
    if os.environ.get(ENV_COMMIT):
        # Said explicitly by whoever copied the tree; it wins over a .git found there (the device
        # machine's copy once carried a repository at an older commit than the tree it ran).
        dirty = os.environ.get(ENV_DIRTY)
        return {"commit": os.environ[ENV_COMMIT], "dirty": None if dirty is None else dirty == "1",
                "source": "environment"}
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status)}


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def software() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "grpo_conform": grpo_conform.__version__,
        "cuda_runtime": torch.version.cuda,
        **{f"git_{k}": v for k, v in git_state().items()},
    }


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"kind": "cpu", "name": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(device)
    return {
        "kind": "cuda",
        "name": props.name,
        "driver": driver_version(),
        "memory_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "compute_capability": f"{props.major}.{props.minor}",
    }
