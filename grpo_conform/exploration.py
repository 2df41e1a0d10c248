"""`check --explore N`: the property-based explorer of each operation, by operation name.

An explorer drives a live worker session through the conformance engine (grpo_conform/checks), so it
sits above both the checks and the operations: the operation interface stays free of the engine and
no import circle forms (ops -> explorer -> checks -> ops). A plain dict, as the operation registry.
"""

from __future__ import annotations

from typing import Any, Callable

from grpo_conform.errors import GrpoConformError
from grpo_conform.ops import operation_name
from grpo_conform.ops.grpo_logits.explore import explore_workload as _grpo_logits
from grpo_conform.results import WorkloadResult

Explorer = Callable[[Any, Any, int, Any], WorkloadResult]  # (session, spec, cases, implementation)

EXPLORERS: dict[str, Explorer] = {"grpo-logits": _grpo_logits}


class NoExplorer(GrpoConformError):
    """`--explore` asked of an operation that has no explorer yet."""


def explore_workload(session: Any, spec: Any, cases: int, impl: Any) -> WorkloadResult:
    """N property-based cases of the spec's operation, a failure shrunk to a runnable snippet."""
    name = operation_name(spec)
    try:
        explorer = EXPLORERS[name]
    except KeyError:
        raise NoExplorer(f"--explore: operation {name!r} ({getattr(spec, 'source', '') or spec.id}) has no "
                         f"explorer (explorers: {', '.join(sorted(EXPLORERS))}); run the check without --explore") from None
    return explorer(session, spec, cases, impl)
