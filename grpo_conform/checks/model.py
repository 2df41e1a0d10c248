"""What the conformance run knows of the semantics: the parameter values drawn for a workload,
the values passed to the implementation, and the float64 reference at those values.

Conformance calls use parameters drawn by `grpo_conform.spec.draws` from each parameter's declared
`draw` range (from the parent's seed; temperature always away from 1), so a missing 1/T factor or an
ignored epsilon shows; timed runs keep the declared defaults. Specs written before draws existed (the
frozen seed file) get the built-in table `spec.draws.BUILTIN_DRAWS`, the one docs/checks.md describes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch

from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_logits import reference as ref
from grpo_conform.phases import PHASES
from grpo_conform.spec import Spec, draw_parameters


def draw_values(spec: Spec, rng: random.Random) -> dict[str, Any]:
    """Parameter values for the conformance calls of one workload: every declared parameter."""
    return draw_parameters(spec, rng)


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
    def operation(self):
        return operation_for(self.spec)

    @property
    def params(self):
        return self.operation.parameters(self.spec, self.values)

    def loss(self, x: Mapping[str, torch.Tensor]) -> float:
        with PHASES("judge"):
            return self.operation.reference_loss(self.spec, x, self.params)

    def gradient(self, x: Mapping[str, torch.Tensor],
                 logp_error: torch.Tensor | None = None) -> Iterator[ref.GradientChunk]:
        """The differentiable input's reference gradient, chunked (`logp_error` [B, S]: see
        `reference.chunked_gradient`; the chunks then carry the log-prob bounds)."""
        grads = self.operation.reference_gradients(self.spec, x, self.params, logp_error=logp_error)
        return grads[self.spec.differentiable_input.name]

    def uses_logprobs(self, x: Mapping[str, torch.Tensor]) -> bool:
        """Whether the loss depends on the log-probs (a ratio, CISPO's weight or a KL term)."""
        return ref.needs_logprobs(x, self.params)

    def loss_logprob_error(self, x: Mapping[str, torch.Tensor], logp_error: torch.Tensor) -> float:
        """How far the loss moves when every logp is off by at most `logp_error` (0 without log-probs)."""
        if not self.uses_logprobs(x):
            return 0.0
        return ref.loss_logprob_error(x, self.params, logp_error)

    def row_scales(self, x: Mapping[str, torch.Tensor], seq_next: int) -> torch.Tensor:
        return ref.row_scales(x, self.params, seq_next)
