"""Internal errors: an exception raised by grpo-conform's own code in the parent (the reference, its
cache, a comparison, a probe's bookkeeping) while it checks one workload.

Such an exception is a bug of the validator, not evidence about the implementation. It used to end
`grpo-conform check` with a Python traceback, and no record was written for the workloads judged
before it (seen on the H200: a KeyError in checks/reference_cache.py). Now it ends that workload
only: the checks the failing step was feeding, and every check not yet judged, are reported
`skipped` with the exception's type and message and a request to report it; the exception and the
last frames of its traceback go into the workload's draws under `internal_error`
(`results.INTERNAL_ERROR`). The member is then never conformant (`results.member_status`: skipped,
unless a check genuinely failed), the run exits 3 (`CheckReport.exit_code`: a tool problem), and
every other workload still runs, with a fresh worker (check.py), and gets its record.

Why `skipped` and not `error`: status `error` is a call of the implementation that raised, crashed
or hung; `verify` counts it against the implementation (evidence/semantics.py). An internal error
judged nothing, so it is recorded as not judged; what marks it is the `internal_error` evidence.

What is not caught: the library's own errors (`GrpoConformError`: a refused spec, a worker killed
from outside, exit 2 or 3 with their message, as before) and `BaseException`s that are not
`Exception`s: Ctrl-C (KeyboardInterrupt) and SIGTERM (`gate.signals.Terminated`) still stop the run.
"""

from __future__ import annotations

import traceback
from typing import Any

from grpo_conform.errors import GrpoConformError
from grpo_conform.results import INTERNAL_ERROR, CheckOutcome

REPORT = ("this is a bug in grpo-conform, not a finding about the implementation: please report it to the "
          "grpo-conform maintainers with this message (the record's draws.internal_error holds the traceback)")
FRAMES = 8  # the innermost frames kept: where in grpo-conform it raised


def is_internal(exc: BaseException) -> bool:
    """An exception that is grpo-conform's own bug: an `Exception` the library did not raise on purpose."""
    return isinstance(exc, Exception) and not isinstance(exc, GrpoConformError)


def describe(exc: BaseException, where: str) -> dict[str, Any]:
    """JSON-ready facts of the exception: type, message, the step it ended, the innermost frames."""
    frames = traceback.extract_tb(exc.__traceback__)[-FRAMES:]
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            "message": str(exc)[:500], "where": where,
            "traceback": [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in frames], "report": REPORT}


def message(info: dict[str, Any]) -> str:
    """One outcome's message: what raised, where, and what to do."""
    shown = f"{info['type']}: {info['message']}" if info["message"] else info["type"]
    at = f" at {info['traceback'][-1]}" if info.get("traceback") else ""
    return f"not judged: internal error of grpo-conform in {info['where']} ({shown}{at}); please report it"


def outcomes(checks: tuple[str, ...] | list[str], info: dict[str, Any]) -> tuple[CheckOutcome, ...]:
    """`checks` reported not judged because of the internal error `info` (a workload that raised
    before its conformance run built its own outcomes)."""
    return tuple(CheckOutcome(c, "skipped", message(info), {INTERNAL_ERROR: info}) for c in checks)


def _short(path: str) -> str:
    """A frame's file from the package root on (`grpo_conform/checks/...`), else its name."""
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[parts.index("grpo_conform"):]) if "grpo_conform" in parts else parts[-1]
