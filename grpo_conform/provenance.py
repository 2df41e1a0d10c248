"""Where a result came from: versions, the GPU and driver, the project's git commit, UTC time."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import grpo_conform
from grpo_conform.errors import GrpoConformError

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
# What the evidence schema accepts as a commit: a full SHA-1 or SHA-256 object name.
_COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


class ProvenanceError(GrpoConformError):
    """$GRPO_CONFORM_GIT_COMMIT / $GRPO_CONFORM_GIT_DIRTY say something a record cannot carry."""


#: The validator's own profiling switches (phases.py, isolation/worker.py, sampler.py): set, they change the run.
PROFILING_SWITCHES = ("GRPO_CONFORM_PHASE_SYNC", "GRPO_CONFORM_WORKER_PROFILE", "GRPO_CONFORM_SAMPLE")


def check_environment() -> None:
    """Fail before anything runs when the commit said in the environment could not go into a record
    (an abbreviated hash once cost a whole GPU run: every workload passed, then no record was written)."""
    commit = os.environ.get(ENV_COMMIT)
    if commit and not _COMMIT.fullmatch(commit):
        raise ProvenanceError(f"${ENV_COMMIT}={commit!r}: expected the full commit hash (40 or 64 lowercase hex "
                              f"digits; `git rev-parse HEAD` prints it)")
    dirty = os.environ.get(ENV_DIRTY)
    if commit and dirty not in (None, "0", "1"):
        raise ProvenanceError(f"${ENV_DIRTY}={dirty!r}: expected 0 (the tree is the commit) or 1 (it differs)")
    profiling = [name for name in PROFILING_SWITCHES if os.environ.get(name, "").strip() not in ("", "0")]
    if profiling:  # a profiled worker or a parent waiting at every phase: not the run a record describes
        raise ProvenanceError(f"{', '.join(profiling)} set: a profiled run writes no evidence record; "
                              "add --no-evidence, or unset it")


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
        import triton  # optional: the validator runs without it
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
