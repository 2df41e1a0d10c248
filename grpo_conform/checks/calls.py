"""What a conformance run's calls are made of: the probe the engine is handed, a judged call, a kept output's
fingerprint, and the checks every call feeds. Apart from the engine (conformance.py), so that its worker steps
(worker_calls.py) and its judging (judge_calls.py) share them without an import circle; conformance.py re-exports
them, where the probes import them from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpo_conform.checks.buffers import InputSlot
from grpo_conform.isolation.session import WorkerFailure
from grpo_conform.spec import Spec

PLAIN = ("runs", "contract", "loss", "gradient", "gradient-row-sums", "last-row-zero", "finite",
         "no-mutation", "no-aliasing")
# What every judged call feeds besides its own check: whether it returned, whether it changed or
# shares storage with its inputs, and (its outputs kept for the end re-read) no-output-reuse.
CALL = ("runs", "no-mutation", "no-aliasing", "no-output-reuse")
# Properties of d logits rows: not applicable to an operation whose spec gives no logits (seq_next absent).
LOGITS_ROW_CHECKS = ("gradient-row-sums", "last-row-zero")
GONE = ("timeout", "crash", "cuda-error", "protocol")
KEEP_FRACTION_CUDA = 0.25  # of the GPU's memory: how much the worker may keep of earlier outputs


def everywhere(spec: Spec) -> str | None:
    return None


@dataclass(frozen=True)
class Probe:
    """One step of a conformance run, as the engine is handed it (the registry: checks/probes.py).

    `feeds`: every check the probe records findings for. `-k` selects probes by it, so it must be
    complete: a finding outside it is noted in the workload's draws (`undeclared_findings`, which the
    gallery tests refuse). `own`: the checks the probe alone stands for; when `applies(spec)` gives
    a reason, they are not applicable to the member (left out of the outcomes, the reason kept in the
    draws) and the probe does not run. `needs`: earlier probes whose results (`run.state`, the input
    set Q) it reads; a selection that keeps a probe keeps what it needs."""

    name: str
    summary: str
    run: Callable[[Any], None]  # called with the WorkloadConformance (conformance.py)
    feeds: tuple[str, ...]
    own: tuple[str, ...] = ()
    applies: Callable[[Spec], str | None] = everywhere
    needs: tuple[str, ...] = ()


class WorkerGone(Exception):
    def __init__(self, failure: WorkerFailure):
        self.failure = failure


@dataclass
class Call:
    label: str
    slot: InputSlot
    upstream: float
    loss: float
    loss_desc: dict[str, Any] | None
    grad_descs: dict[str, dict[str, Any] | None]  # the worker's description of each gradient, by input
    grads: dict[str, torch.Tensor]  # the output slot's buffers: valid until the next export into that slot
    skipped_backward: str | None
    kept: bool = False

    @property
    def missing(self) -> list[str]:
        """The inputs backward left no gradient on (every gradient the output slot holds is expected)."""
        return [name for name in self.grads if self.grad_descs.get(name) is None]

    @property
    def grad(self) -> torch.Tensor:
        """The only gradient (probes of a single-gradient operation read it by this name)."""
        return self.grads[self._only()]

    @property
    def grad_desc(self) -> dict[str, Any] | None:
        return self.grad_descs.get(self._only())

    def _only(self) -> str:
        if len(self.grads) != 1:
            raise ValueError(f"call {self.label} has gradients {sorted(self.grads)}: name one (Call.grads)")
        return next(iter(self.grads))


@dataclass
class Kept:
    label: str
    fingerprint: tuple[int, int]  # (the loss's float64 bits, the gradients' keyed checksum)


#: the slots made on first use (`WorkloadConformance.__getattr__`)
