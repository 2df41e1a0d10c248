"""What the conformance run knows of the semantics: the parameter values drawn for a workload,
the values passed to the implementation, and the float64 reference at those values.

Conformance calls use parameters drawn from each parameter's declared `draw` range (from the
parent's seed; temperature always away from 1), so a missing 1/T factor or an ignored epsilon
shows; timed runs keep the declared defaults. Specs written before domains existed (the frozen
seed file) get the built-in draws below, documented in docs/checks.md.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch

from grpo_conform import reference as ref
from grpo_conform.phases import PHASES
from grpo_conform.spec import Spec

# Draw ranges for the frozen seed file's three parameters (it declares no domains).
BUILTIN_DRAWS: dict[str, tuple[float, float, float]] = {
    # name: (low, high, keep-away-from value)
    "temperature": (0.45, 2.2, 1.0),
    "epsilon_low": (0.05, 0.4, 0.2),
    "epsilon_high": (0.05, 0.5, 0.2),
}
_AWAY = 0.05  # drawn values stay this far from the keep-away value


def _builtin_draw(spec: Spec, rng: random.Random) -> dict[str, Any]:
    values = dict(spec.parameter_values)
    for name, (low, high, away) in BUILTIN_DRAWS.items():
        if name not in values:
            continue
        while True:
            v = rng.uniform(low, high)
            if abs(v - away) >= _AWAY:
                break
        values[name] = round(v, 6)
    return values


def draw_values(spec: Spec, rng: random.Random) -> dict[str, Any]:
    """Parameter values for the conformance calls of one workload."""
    import grpo_conform.spec as spec_module

    drawer = getattr(spec_module, "draw_parameters", None)
    if drawer is not None and any(getattr(p, "draw", None) is not None for p in spec.parameters):
        values = dict(spec.parameter_values)
        values.update(drawer(spec, rng))
        return values
    return _builtin_draw(spec, rng)


def _new_api() -> bool:
    return hasattr(ref.GrpoParameters, "from_spec") and len(inspect.signature(ref.reference_loss).parameters) <= 3


@dataclass(frozen=True)
class ReferenceModel:
    spec: Spec
    values: dict[str, Any]

    @classmethod
    def drawn(cls, spec: Spec, rng: random.Random) -> "ReferenceModel":
        return cls(spec, draw_values(spec, rng))

    @classmethod
    def defaults(cls, spec: Spec) -> "ReferenceModel":
        return cls(spec, dict(spec.parameter_values))

    @property
    def temperature(self) -> float:
        return float(self.values.get("temperature", 1.0))

    @property
    def call_values(self) -> dict[str, Any]:
        """Exactly the parameters the spec declares, by name (the call convention)."""
        return {p.name: self.values[p.name] for p in self.spec.parameters}

    @property
    def params(self):
        if _new_api():
            return ref.GrpoParameters.from_spec(self.spec, self.values)
        return ref.GrpoParameters.from_mapping(self.values)

    def loss(self, x: Mapping[str, torch.Tensor]) -> float:
        with PHASES("judge"):
            return self._loss(x)

    def _loss(self, x: Mapping[str, torch.Tensor]) -> float:
        if _new_api():
            return ref.reference_loss(x, self.params)
        return ref.reference_loss(x["logits"], x["completion_ids"], x["advantages"], self.params)

    def gradient(self, x: Mapping[str, torch.Tensor],
                 logp_error: torch.Tensor | None = None) -> Iterator[ref.GradientChunk]:
        """`logp_error` [B, S]: see `reference.chunked_gradient` (chunks then carry the log-prob bounds)."""
        if _new_api():
            return ref.reference_gradient(x, self.params, logp_error=logp_error)
        return ref.reference_gradient(x["logits"], x["completion_ids"], x["advantages"], self.params)

    def uses_logprobs(self, x: Mapping[str, torch.Tensor]) -> bool:
        """Whether the loss depends on the log-probs (a ratio, CISPO's weight or a KL term)."""
        return _new_api() and ref.needs_logprobs(x, self.params)

    def loss_logprob_error(self, x: Mapping[str, torch.Tensor], logp_error: torch.Tensor) -> float:
        """How far the loss moves when every logp is off by at most `logp_error` (0 without log-probs)."""
        if not self.uses_logprobs(x):
            return 0.0
        return ref.loss_logprob_error(x, self.params, logp_error)

    def row_scales(self, x: Mapping[str, torch.Tensor], seq_next: int) -> torch.Tensor:
        if _new_api():
            return ref.row_scales(x, self.params, seq_next)
        return ref.row_scales(x["advantages"], seq_next, self.params)
