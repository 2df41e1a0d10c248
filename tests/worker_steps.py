"""One call of an implementation in a worker, driven as the conformance engine drives it (the live
worker protocol: forward, backward with an upstream scalar, export), for tests that need an
implementation to run once without the engine. The worker's dead one-shot `call` op is gone
(issue 30); these steps are the ones the parent sends."""

from __future__ import annotations

from typing import Any

from grpo_conform.isolation.session import WorkerSession

GRADIENTS = ["logits"]  # the seed spec's one differentiable input


def call_once(session: WorkerSession, inputs: str = "in", outputs: str | None = None, upstream: float = 1.0,
              label: str = "call") -> dict[str, Any] | None:
    """forward (grad on), backward, then export into `outputs` (its report returned) or drop."""
    session.request(op="forward", call=label, inputs=inputs, params=session.parameters, grad=True,
                    gradients=GRADIENTS)
    session.request(op="backward", calls=[label], upstream=[upstream])
    if outputs is None:
        session.request(op="drop", calls=[label])
        return None
    return session.request(op="export", call=label, outputs=outputs, keep=False)["report"]
