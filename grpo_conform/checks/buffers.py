"""Parent-side buffers shared with a worker: input sets with a pristine copy, and output slots.

The pristine copy is the parent's own record of what an input set must hold; the reference is
always computed from it, never from the shared buffer the implementation could have written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_conform.compare import first_difference
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.phases import PHASES


@dataclass
class InputSlot:
    name: str
    tensors: dict[str, torch.Tensor]
    pristine: dict[str, torch.Tensor]
    layout: dict[str, dict[str, Any]] = field(default_factory=dict)  # views: offset and strides

    @classmethod
    def create(cls, session: WorkerSession, name: str, shapes: dict[str, tuple[int, ...]],
               dtypes: dict[str, torch.dtype]) -> "InputSlot":
        tensors, descs = {}, {}
        for key, shape in shapes.items():
            tensors[key], descs[key] = session.allocator.empty(shape, dtypes[key])
        session.bind(name, descs)
        pristine = {k: torch.empty_like(v) for k, v in tensors.items()}
        return cls(name, tensors, pristine)

    @classmethod
    def create_views(cls, session: WorkerSession, name: str, shapes: dict[str, tuple[int, ...]],
                     dtypes: dict[str, torch.dtype], rng: random.Random) -> "InputSlot":
        """Inputs that are offset, strided views of larger shared buffers (the last dimension
        stays contiguous): a rank-1 input takes every other element after a drawn offset; a
        higher-rank one is a slice [o:, o:, ..., :n] of a buffer padded in every dimension."""
        tensors, descs, layout = {}, {}, {}
        for key, shape in shapes.items():
            offset = rng.randint(1, 3)
            if len(shape) <= 1:
                n = shape[0] if shape else 1
                base_shape: tuple[int, ...] = (2 * n + offset,)
                stride: tuple[int, ...] = (2,)
                storage_offset = offset
            else:
                base_shape = tuple(d + offset for d in shape[:-1]) + (shape[-1] + rng.randint(1, 5),)
                stride = tuple(_contiguous_strides(base_shape))
                storage_offset = sum(offset * s for s in stride[:-1])
            base, desc = session.allocator.empty(base_shape, dtypes[key])
            base.zero_()
            view = base.as_strided(shape, stride, storage_offset)
            tensors[key] = view
            layout[key] = {"shape": list(shape), "stride": list(stride), "storage_offset": storage_offset,
                           "base_shape": list(base_shape)}
            if desc.get("kind") == "cuda_ipc":
                from grpo_conform.isolation.sharing import cuda_descriptor

                descs[key] = cuda_descriptor(view)  # torch's IPC rebuild keeps offset and strides
            else:
                descs[key] = dict(desc, view={"storage_offset": storage_offset, "shape": list(shape),
                                              "stride": list(stride)})
        session.bind(name, descs)
        pristine = {k: torch.empty(v.shape, dtype=v.dtype, device=v.device) for k, v in tensors.items()}
        return cls(name, tensors, pristine, layout)

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
        with PHASES("input-checks"):
            for k, v in self.tensors.items():
                diff = first_difference(v, self.pristine[k])
                if diff is not None:
                    found[k] = diff
        return found


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


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
