"""Operations the validator checks (issue 30): a plain registry {operation name: operation object}.

A spec names its operation in an `operation` field. A spec without one (every spec written before
operations were plug-ins: the frozen seed file `specs/grpo-token-is.v1.json`, identity a1591ee3...,
and the `grpo` family) is GRPO over materialised logits, "grpo-logits". The default is applied when
the spec is read here, never written into it: the field is not part of any identity that exists
today, so every committed spec, member and record identity stays as it is (docs/operations.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_conform.errors import GrpoConformError
from grpo_conform.spec import DEFAULT_OPERATION, Spec, operation_of

if TYPE_CHECKING:
    from grpo_conform.ops.interface import Operation

_OPERATIONS: dict[str, "Operation"] = {}


def _operations() -> dict[str, "Operation"]:
    """The registry, built at its first use: the operations import torch (their inputs and judging),
    and the commands that only name an operation (`init`, `report`'s selection) or import a
    module of this package (ops.interface) did so through this package's import, ~3 s of CPU for each
    such CLI run (docs/timing.md, "Third pass")."""
    if not _OPERATIONS:
        # local: both operations import torch (start-up time of init and report)
        from grpo_conform.ops.fused_linear.operation import GRPO_FUSED_LINEAR
        from grpo_conform.ops.grpo_logits.operation import GRPO_LOGITS

        _OPERATIONS.update({GRPO_LOGITS.name: GRPO_LOGITS, GRPO_FUSED_LINEAR.name: GRPO_FUSED_LINEAR})
    return _OPERATIONS


def __getattr__(name: str) -> Any:
    """`OPERATIONS` (a plain dict {operation name: operation object}), built on first access."""
    if name == "OPERATIONS":
        return _operations()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class UnknownOperation(GrpoConformError):
    """A spec names an operation this validator does not implement."""


def operation_name(spec: Any) -> str:
    """The spec's operation; absent means grpo-logits (not part of any identity: see the module's note).
    A loaded Spec answers through `spec.operation_of`; other objects (test doubles) may carry the field."""
    if isinstance(spec, Spec):
        return operation_of(spec)
    return getattr(spec, "operation", None) or DEFAULT_OPERATION


def operation_for(spec: Any) -> Operation:
    """The operation object a spec names, or a clear error naming the spec and the known operations."""
    name = operation_name(spec)
    operations = _operations()
    try:
        return operations[name]
    except KeyError:
        where = getattr(spec, "source", "") or getattr(spec, "id", "the spec")
        raise UnknownOperation(
            f"{where}: field 'operation': {name!r} is not an operation this validator knows (known: "
            f"{', '.join(sorted(operations))}); name one of them, or upgrade grpo-conform if the spec was "
            "written for a newer version") from None
