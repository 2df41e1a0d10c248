"""How tensors cross the process boundary, in both directions, without pickle from the child.

- CPU tensors live in sealed memfds (anonymous shared memory, no name in any file system):
  the parent creates one per tensor, sizes it, adds F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL
  and maps it MAP_SHARED; the worker receives the file descriptor over the session's socket
  (SCM_RIGHTS) and maps it too. A write by either side is seen by the other, so the parent
  observes every input buffer exactly as the implementation left it; but the worker can neither
  shrink the memory under the parent's mapping (no SIGBUS in the validator: issue 11) nor add a
  seal, and nothing is left in /dev/shm when a process dies.
- CUDA tensors are allocated by the parent and opened in the worker through CUDA IPC handles
  (torch's own reduction, pickled by the parent and unpickled by the worker). The importer cannot
  free or resize an IPC allocation; it can only write into it, which the checks see.

A descriptor may carry a `view` (`storage_offset`, `shape`, `stride`, in elements): the worker
maps the whole base buffer and hands the implementation `base.as_strided(shape, stride, offset)`,
so an input can be a slice of a larger buffer, as real `input_ids[:, P:]` slices are.

Descriptors are JSON; the parent never unpickles anything that comes from the worker.
"""

from __future__ import annotations

import base64
import fcntl
import mmap
import os
import pickle
from dataclasses import dataclass, field
from math import prod
from typing import Any, Literal

import torch
import torch.multiprocessing  # noqa: F401  (registers torch's CUDA IPC reductions)
from torch.multiprocessing.reductions import reduce_tensor

from grpo_conform.dtypes import dtype_name as name_of_dtype
from grpo_conform.dtypes import torch_dtype as dtype_from_name

ViewKind = Literal["contiguous", "offset", "strided"]
VIEW_KINDS: tuple[str, ...] = ("contiguous", "offset", "strided")
#: Elements before an `offset` view (an odd count: the view's address is not 16-byte aligned, as a
#: slice `input_ids[:, P:]` usually is not) and the padding added to each outer dimension of a
#: `strided` view (so rows are not adjacent, as in `logits[:, :, :V]` of a wider buffer).
VIEW_OFFSET = 3
VIEW_PAD = 5
#: Bytes the padding of a view's base buffer holds: NaN in every float dtype, -1 in every signed
#: integer dtype, so a kernel that reads outside its view reads garbage the checks see.
PAD_BYTE = 0xFF
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(1, size)
    return tuple(reversed(strides))


def view_layout(shape: tuple[int, ...], kind: str) -> tuple[int, tuple[int, ...], int]:
    """(storage_offset, strides, base numel) of a `kind` view of `shape` inside a larger buffer.

    contiguous: offset 0, dense. offset: dense, VIEW_OFFSET elements in. strided: VIEW_OFFSET in,
    every dimension but the last padded by VIEW_PAD elements (the last stays dense); a 1-D tensor
    gets stride 2 (a column of a [n, 2] buffer)."""
    if kind not in VIEW_KINDS:
        raise ValueError(f"unknown view kind {kind!r}: expected one of {', '.join(VIEW_KINDS)}")
    if kind == "contiguous":
        return 0, contiguous_strides(shape), max(1, prod(shape))
    if kind == "offset" or not shape:
        return VIEW_OFFSET, contiguous_strides(shape), VIEW_OFFSET + max(1, prod(shape)) + VIEW_OFFSET
    if len(shape) == 1:
        strides = (2,)
    else:
        strides = contiguous_strides(tuple(n + VIEW_PAD for n in shape))
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 1
    return VIEW_OFFSET, strides, VIEW_OFFSET + extent + VIEW_PAD


def _sealed_memfd(nbytes: int) -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_memfd(fd: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor over the whole memfd, shared with every other mapping of it."""
    mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    size = torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mm, dtype=dtype, count=nbytes // size)  # keeps `mm` alive


@dataclass
class SharedAllocator:
    """Parent side: makes tensors the worker can map, and their JSON descriptors.

    CPU descriptors name a memfd by number (`fd`); `fds_for` gives the file descriptors a bind
    message must carry. `close` releases them (the parent's own mappings stay valid)."""

    device: torch.device
    _fds: dict[int, int] = field(default_factory=dict)
    _count: int = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, describe: bool = True) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.empty_view(shape, dtype, "contiguous", describe)

    def empty_view(self, shape: tuple[int, ...], dtype: torch.dtype, view_kind: str = "contiguous",
                   describe: bool = True) -> tuple[torch.Tensor, dict[str, Any]]:
        """A `view_kind` view of a larger base buffer (its padding holds PAD_BYTE), and its descriptor.
        `describe=False` on CUDA: no IPC descriptor (the caller sends one of a view of it). Every CUDA
        descriptor made must reach the worker: torch counts each one as a reference the worker will
        let go of, and frees the buffer only then (an unsent one pinned it for the rest of the run)."""
        shape = tuple(int(d) for d in shape)
        offset, strides, base_numel = view_layout(shape, view_kind)
        view = {"storage_offset": offset, "shape": list(shape), "stride": list(strides)}
        if self.device.type == "cuda":
            base = torch.empty(base_numel, dtype=dtype, device=self.device)
            desc = cuda_descriptor(base) if describe else {"kind": "cuda_ipc"}
        else:
            nbytes = base_numel * torch.empty((), dtype=dtype).element_size()
            fd = _sealed_memfd(nbytes)
            self._count += 1
            self._fds[self._count] = fd
            base = map_memfd(fd, nbytes, dtype)
            desc = {"kind": "memfd", "fd": self._count, "nbytes": nbytes, "dtype": name_of_dtype(dtype)}
        if view_kind != "contiguous":
            base.view(torch.uint8).fill_(1 if dtype == torch.bool else PAD_BYTE)
        desc["view"] = view
        return base.as_strided(shape, strides, offset), desc

    def share(self, source: torch.Tensor, view_kind: str = "contiguous") -> tuple[torch.Tensor, dict[str, Any]]:
        t, desc = self.empty_view(tuple(source.shape), source.dtype, view_kind)
        t.copy_(source)
        return t, desc

    def fds_for(self, descriptors: dict[str, dict[str, Any]]) -> list[int]:
        return [self._fds[d["fd"]] for d in descriptors.values() if d.get("kind") == "memfd"]

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


class _Rebuild:
    """Pickles as `fn(*args)`: the worker needs nothing of ours to rebuild the tensor."""

    def __init__(self, fn: Any, args: tuple):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def cuda_descriptor(t: torch.Tensor) -> dict[str, Any]:
    """torch's CUDA IPC reduction of `t`. `ref_counter` names the /dev/shm file in which torch
    counts the importers of the allocation: the session gives it to the worker user (torch creates
    it 0600), see WorkerSession.bind and docs/checks.md for what that leaves open."""
    fn, args = reduce_tensor(t)
    counter = next((a for a in args if isinstance(a, bytes) and a.startswith(b"/torch_")), None)
    desc = {
        "kind": "cuda_ipc",
        "pickle": base64.b64encode(pickle.dumps(_Rebuild(fn, args))).decode(),
        "dtype": name_of_dtype(t.dtype),
        "shape": list(t.shape),
    }
    if counter is not None:
        desc["ref_counter"] = counter.decode()
    return desc


def _apply_view(base: torch.Tensor, desc: dict[str, Any]) -> torch.Tensor:
    view = desc.get("view")
    if view is None and desc["kind"] == "cuda_ipc":
        return base  # torch's IPC rebuild keeps the sender's offset and strides
    if view is None:
        shape = tuple(desc["shape"])
        return base.reshape(-1)[: prod(shape)].view(shape)
    shape, stride, offset = tuple(view["shape"]), tuple(view["stride"]), int(view["storage_offset"])
    extent = offset + (1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0)
    if offset < 0 or any(s < 0 for s in stride) or extent > base.numel():
        raise ValueError(f"descriptor view {view} does not fit a base buffer of {base.numel()} elements")
    return base.as_strided(shape, stride, offset)


def open_descriptor(desc: dict[str, Any], fds: dict[int, int] | None = None) -> torch.Tensor:
    """Worker side: map a tensor the parent shared. `fds` maps a memfd descriptor's number to the
    file descriptor that arrived with the bind message."""
    kind = desc["kind"]
    if kind == "memfd":
        if fds is None or desc["fd"] not in fds:
            raise ValueError(f"memfd descriptor {desc['fd']} arrived without its file descriptor")
        base = map_memfd(fds[desc["fd"]], int(desc["nbytes"]), dtype_from_name(desc["dtype"]))
        return _apply_view(base, desc)
    if kind == "cuda_ipc":
        return _apply_view(pickle.loads(base64.b64decode(desc["pickle"])), desc)
    raise ValueError(f"unknown tensor descriptor kind {kind!r}")
