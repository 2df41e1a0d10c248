"""How tensors cross the process boundary, in both directions, without pickle from the child.

- CPU tensors live in files under the session's private temporary directory (mode 0700, on
  /dev/shm when it exists), mapped MAP_SHARED by parent and worker (`torch.from_file(...,
  shared=True)`): a write by either side is seen by the other, so the parent observes every
  input buffer exactly as the implementation left it.
- CUDA tensors are allocated by the parent and opened in the worker through CUDA IPC handles
  (torch's own reduction, pickled by the parent and unpickled by the worker).

Descriptors are JSON; the parent never unpickles anything that comes from the worker.
"""

from __future__ import annotations

import base64
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers torch's CUDA IPC reductions)

from grpo_conform.dtypes import dtype_name as name_of_dtype
from grpo_conform.dtypes import torch_dtype as dtype_from_name

def private_dir() -> Path:
    """A fresh 0700 directory, on tmpfs when the machine has one."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="grpo-conform-", dir=base))


@dataclass
class SharedAllocator:
    """Parent side: makes tensors the worker can map, and their JSON descriptors."""

    directory: Path
    device: torch.device
    _count: int = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, Any]]:
        if self.device.type == "cuda":
            t = torch.empty(shape, dtype=dtype, device=self.device)
            return t, cuda_descriptor(t)
        self._count += 1
        path = self.directory / f"t{self._count}.bin"
        numel = 1
        for d in shape:
            numel *= d
        size = max(1, numel) * torch.empty((), dtype=dtype).element_size()
        with open(path, "wb") as f:
            f.truncate(size)
        t = torch.from_file(str(path), shared=True, size=max(1, numel), dtype=dtype)[:numel].view(shape)
        return t, {"kind": "file", "path": str(path), "dtype": name_of_dtype(dtype), "shape": list(shape)}

    def share(self, source: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        t, desc = self.empty(tuple(source.shape), source.dtype)
        t.copy_(source)
        return t, desc


def cuda_descriptor(t: torch.Tensor) -> dict[str, Any]:
    from multiprocessing.reduction import ForkingPickler

    return {
        "kind": "cuda_ipc",
        "pickle": base64.b64encode(bytes(ForkingPickler.dumps(t))).decode(),
        "dtype": name_of_dtype(t.dtype),
        "shape": list(t.shape),
    }


def open_descriptor(desc: dict[str, Any]) -> torch.Tensor:
    """Worker side: map a tensor the parent shared."""
    if desc["kind"] == "file":
        shape = tuple(desc["shape"])
        numel = 1
        for d in shape:
            numel *= d
        t = torch.from_file(desc["path"], shared=True, size=max(1, numel), dtype=dtype_from_name(desc["dtype"]))
        return t[:numel].view(shape)
    if desc["kind"] == "cuda_ipc":
        return pickle.loads(base64.b64decode(desc["pickle"]))
    raise ValueError(f"unknown tensor descriptor kind {desc['kind']!r}")
