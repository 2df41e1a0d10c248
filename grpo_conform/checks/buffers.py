"""Parent-side buffers shared with a worker: input sets with a pristine copy, and output slots.

The pristine copy is the parent's own record of what an input set must hold; the reference is
always computed from it, never from the shared buffer the implementation could have written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_conform.compare import first_difference
from grpo_conform.isolation.session import WorkerSession


@dataclass
class InputSlot:
    name: str
    tensors: dict[str, torch.Tensor]
    pristine: dict[str, torch.Tensor]

    @classmethod
    def create(cls, session: WorkerSession, name: str, shapes: dict[str, tuple[int, ...]],
               dtypes: dict[str, torch.dtype]) -> "InputSlot":
        tensors, descs = {}, {}
        for key, shape in shapes.items():
            tensors[key], descs[key] = session.allocator.empty(shape, dtypes[key])
        session.bind(name, descs)
        pristine = {k: torch.empty_like(v) for k, v in tensors.items()}
        return cls(name, tensors, pristine)

    def commit(self) -> None:
        """Record the current contents (just written by the parent) as what they must stay."""
        for k, v in self.tensors.items():
            self.pristine[k].copy_(v)

    def write(self, values: dict[str, torch.Tensor]) -> None:
        for k, v in values.items():
            self.tensors[k].copy_(v)
        self.commit()

    def restore(self) -> None:
        for k, v in self.pristine.items():
            self.tensors[k].copy_(v)

    def changes(self) -> dict[str, Any]:
        """Inputs whose bytes differ from the pristine copy, with where and how."""
        found = {}
        for k, v in self.tensors.items():
            diff = first_difference(v, self.pristine[k])
            if diff is not None:
                found[k] = diff
        return found


@dataclass
class OutputSlot:
    name: str
    loss: torch.Tensor  # float64 [1]
    grad: torch.Tensor  # logits' shape and dtype

    @classmethod
    def create(cls, session: WorkerSession, name: str, grad_shape: tuple[int, ...],
               grad_dtype: torch.dtype) -> "OutputSlot":
        loss, loss_desc = session.allocator.empty((1,), torch.float64)
        grad, grad_desc = session.allocator.empty(grad_shape, grad_dtype)
        session.bind(name, {"loss": loss_desc, "grad": grad_desc})
        return cls(name, loss, grad)

    def clear(self) -> None:
        self.loss.fill_(float("nan"))
        self.grad.fill_(float("nan"))
