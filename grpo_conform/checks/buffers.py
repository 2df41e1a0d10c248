"""Parent-side buffers shared with a worker: input sets with a pristine copy, and output slots.

The pristine copy is the parent's own record of what an input set must hold; the reference is
always computed from it, never from the shared buffer the implementation could have written.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_conform.compare import bitwise_equal_all, first_difference
from grpo_conform.dtypes import torch_dtype
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.isolation.sharing import cuda_descriptor
from grpo_conform.isolation.worker import GRAD_PREFIX
from grpo_conform.spec import Spec
from grpo_conform.phases import PHASES


def input_dtypes(spec: Spec, resolved) -> dict[str, torch.dtype]:
    """Each input's dtype at a resolved workload (its declared first where the workload names none)."""
    return {t.name: torch_dtype(resolved.dtypes.get(t.name, t.dtypes[0])) for t in spec.inputs}


class UndrawnInputSet(RuntimeError):
    """A call on an input set no step drew values into: the validator's bug (a probe's order or `needs`), reported
    as the workload's internal error, never a kernel run on leftover memory."""


@dataclass
class InputSlot:
    name: str
    tensors: dict[str, torch.Tensor]
    pristine: dict[str, torch.Tensor]
    layout: dict[str, dict[str, Any]] = field(default_factory=dict)  # views: offset and strides
    version: int = 0  # bumped by every commit: (name, serial, version) names one pristine content (reference_cache)
    # one per slot object: a set let go and made again under its name (WorkloadConformance.release) starts at
    # version 0 again, and (name, version) alone handed it the released set's cached reference
    serial: int = field(default_factory=itertools.count().__next__)
    # whether any values were ever written into the set (`publish`, `write`): a slot is allocated uninitialised, and
    # `commit` alone records whatever the memory held as pristine. A probe that edits a set no step drew (zero-
    # advantage in other-dtypes' pass, where no baseline drew Q) handed the kernel leftover GPU memory as ids, and
    # the validator's own reference kernel then read out of bounds (an illegal memory access, H100 2026-12-06)
    drawn: bool = False

    @classmethod
    def create(cls, session: WorkerSession, name: str, shapes: dict[str, tuple[int, ...]],
               dtypes: dict[str, torch.dtype], pristine: bool = True) -> "InputSlot":
        """`pristine` False: no copy (a set nothing is judged on, check_ahead.py; `commit` must not be called)."""
        tensors, descs = {}, {}
        for key, shape in shapes.items():
            tensors[key], descs[key] = session.allocator.empty(shape, dtypes[key])
        session.bind(name, descs)
        copies = {k: torch.empty_like(v) for k, v in tensors.items()} if pristine else {}
        return cls(name, tensors, copies)

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
            base, desc = session.allocator.empty(base_shape, dtypes[key], describe=False)  # the view's descriptor is sent
            base.zero_()
            view = base.as_strided(shape, stride, storage_offset)
            tensors[key] = view
            layout[key] = {"shape": list(shape), "stride": list(stride), "storage_offset": storage_offset,
                           "base_shape": list(base_shape)}
            if desc.get("kind") == "cuda_ipc":
                descs[key] = cuda_descriptor(view)  # torch's IPC rebuild keeps offset and strides
            else:
                descs[key] = dict(desc, view={"storage_offset": storage_offset, "shape": list(shape),
                                              "stride": list(stride)})
        session.bind(name, descs)
        pristine = {k: torch.empty(v.shape, dtype=v.dtype, device=v.device) for k, v in tensors.items()}
        return cls(name, tensors, pristine, layout)

    def commit(self) -> None:
        """Record the current contents (just written by the parent) as what they must stay."""
        self.version += 1
        for k, v in self.tensors.items():
            self.pristine[k].copy_(v)

    def publish(self) -> None:
        """The other direction of `commit`: contents the parent wrote into the pristine copies, copied to the
        shared buffers (the pristine tensors are only read, so their version counters stay)."""
        self.version += 1
        self.drawn = True
        for k, v in self.pristine.items():
            self.tensors[k].copy_(v)

    def write(self, values: dict[str, torch.Tensor]) -> None:
        for k, v in values.items():
            self.tensors[k].copy_(v)
        self.drawn = self.drawn or set(values) >= set(self.tensors)
        self.commit()

    def restore(self) -> None:
        for k, v in self.pristine.items():
            self.tensors[k].copy_(v)

    def changes(self) -> dict[str, Any]:
        """Inputs whose bytes differ from the pristine copy, with where and how."""
        found = {}
        with PHASES("input-checks"):
            names = list(self.tensors)
            same = bitwise_equal_all([(self.tensors[k], self.pristine[k]) for k in names])  # one read for all
            for k, unchanged in zip(names, same):
                diff = None if unchanged else first_difference(self.tensors[k], self.pristine[k])
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
    """Where the worker copies a call's outputs: the loss, and one buffer per gradient (by the
    name of its input, shaped and typed as that input)."""

    name: str
    loss: torch.Tensor  # float64 [1]
    grads: dict[str, torch.Tensor]

    @classmethod
    def create(cls, session: WorkerSession, name: str,
               gradients: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> "OutputSlot":
        """`gradients`: {input name: (shape, dtype)} of every gradient the spec lists."""
        loss, loss_desc = session.allocator.empty((1,), torch.float64)
        descs, grads = {"loss": loss_desc}, {}
        for key, (shape, dtype) in gradients.items():
            grads[key], descs[GRAD_PREFIX + key] = session.allocator.empty(shape, dtype)
        session.bind(name, descs)
        return cls(name, loss, grads)

    @classmethod
    def for_spec(cls, session: WorkerSession, name: str, spec: Spec, shapes: dict[str, tuple[int, ...]],
                 dtypes: dict[str, torch.dtype]) -> "OutputSlot":
        """A slot for every gradient of `spec`, at the workload's input shapes and dtypes."""
        return cls.create(session, name, {g.input: (shapes[g.input], dtypes[g.input]) for g in spec.gradients})

    @property
    def grad(self) -> torch.Tensor:
        """The only gradient (a single-gradient operation's probes read it by this name)."""
        if len(self.grads) != 1:
            raise ValueError(f"output slot {self.name} holds {len(self.grads)} gradients; name one of {sorted(self.grads)}")
        return next(iter(self.grads.values()))

    def clear(self) -> None:
        self.loss.fill_(float("nan"))
        for g in self.grads.values():
            g.fill_(float("nan"))


def only_gradient(spec: Spec) -> str:
    """The input of the spec's one gradient. Today's reference (GRPO over logits) computes one
    gradient, compared under this name; a spec with several needs its operation's reference, which
    hands a gradient per name (issue 30 item 4, issue 31)."""
    names = [g.input for g in spec.gradients]
    if len(names) != 1:
        raise ValueError(f"spec {spec.id} lists {len(names)} gradients ({', '.join(names)}); the GRPO-over-logits "
                         "reference computes one: the spec's operation must supply a reference per gradient")
    return names[0]


def storage_overlaps(storage: dict[str, list[int] | None], inputs: list[str],
                     gradients: list[str]) -> list[dict[str, Any]]:
    """Every output (the loss, each gradient) whose storage range, as the worker reported it,
    overlaps an input's, and every pair of gradients that share storage (one buffer handed out
    as two gradients: at least one of them is wrong after the other is written). A single
    gradient keeps its historical name "grad" in the evidence."""
    def label(name: str) -> str:
        return "grad" if len(gradients) == 1 else GRAD_PREFIX + name

    def meets(r: list[int], q: list[int]) -> bool:
        return r[0] < q[0] + q[1] and q[0] < r[0] + r[1]

    outputs = [("loss", storage.get("loss"))] + [(label(g), storage.get(GRAD_PREFIX + g)) for g in gradients]
    found: list[dict[str, Any]] = []
    for out_name, r in outputs:
        if not r:
            continue
        for in_name in inputs:
            q = storage.get(in_name)
            if q and meets(r, q):
                found.append({"output": out_name, "input": in_name, "output_range": r, "input_range": q})
    grads = outputs[1:]
    for i, (a, r) in enumerate(grads):
        for b, q in grads[i + 1:]:
            if r and q and meets(r, q):
                found.append({"output": a, "other_output": b, "output_range": r, "other_range": q})
    return found


def overlap_text(o: dict[str, Any]) -> str:
    if "input" in o:
        return f"{o['output']} shares storage with input {o['input']}"
    return f"{o['output']} shares storage with {o['other_output']}"
