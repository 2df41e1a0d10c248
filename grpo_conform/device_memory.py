"""How much GPU memory this process may size its work by: the device's free memory, or, where the GPU
is shared by slots (gate/gpu_share.py), the current workload's grant.

The validator sizes three things by free memory: the kept outputs of `no-output-reuse`
(checks/conformance.py), the reference's float64 chunks (ops/grpo_logits/reference.py) and the timed
buffer sets (checks/timed.py, run with the GPU to itself). Beside other slots, free memory is whatever
they left, which changes from moment to moment: sized by it, what a workload checks would depend on
what ran beside it. Sized by the grant, it does not.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from grpo_conform.dtypes import torch_dtype

_grant: int | None = None  # bytes granted to the running workload; None: the GPU is this run's alone

# What a workload's conformance holds on the GPU, in units of its largest tensor set (inputs, or the
# gradients): the parent's four input/output sets, two pristine copies and two saved gradients, the
# judged outputs' copy, the implementation's own outputs and working set, and one kept output.
# Plus a fixed part: the reference's float64 chunks (their budget is a 64th of the grant,
# reference.budget_for), the kept outputs of small workloads, the worker's poisoned blocks.
# Measured (thirty-third session, H100, the default check without timing, `draws.gpu_grant.peak`): a batch-8
# workload (a set of 1.96 GiB) reserved up to 31.9 GiB in the slot and 12.7 GiB in its worker, 44.6 GiB in all,
# over its 37.3 GiB grant; the 46 small workloads at most 4.0 GiB (median 0.2) of their 6 GiB. The sum fits
# because the small ones' slack covers the big ones' excess. 12 sets + 4 GiB was tried the same day: two batch-8
# workloads side by side ran out of memory and went again alone, no faster (docs/timing.md, "Thirty-third
# session"). So the grant stays 16 sets + 6 GiB; what would let two batch-8 workloads share an H100 is a smaller
# footprint, not a smaller estimate.
SETS_PER_WORKLOAD = 16
FIXED_BYTES = 6 << 30


def estimate(set_bytes: int, grad_bytes: int) -> int:
    """Bytes to ask the gate for, for one workload's conformance (gate/gpu_share.py's "memory")."""
    return SETS_PER_WORKLOAD * max(set_bytes, grad_bytes) + FIXED_BYTES


def set_and_gradient_bytes(spec, resolved) -> tuple[int, int]:
    """Bytes of one input set and of one call's gradients, at the workload's dtypes."""
    def size(name: str) -> int:
        dtype = torch_dtype(resolved.dtypes.get(name, spec.input(name).dtypes[0]))
        return resolved.numel(name) * torch.empty((), dtype=dtype).element_size()

    return sum(size(t.name) for t in spec.inputs), sum(size(g.input) for g in spec.gradients)


def device_free_bytes(device: torch.device | str) -> int:
    """The device's free memory, all processes counted (no grant applies)."""
    return int(torch.cuda.mem_get_info(torch.device(device))[0])


def free_bytes(device: torch.device | str) -> int:
    """The device's free memory, capped by the running workload's grant where there is one."""
    free = device_free_bytes(device)
    return free if _grant is None else int(min(free, _grant))


@contextmanager
def granted(nbytes: int | None) -> Iterator[None]:
    """Within: free_bytes() is at most `nbytes` (None: no cap)."""
    global _grant
    before, _grant = _grant, nbytes
    try:
        yield
    finally:
        _grant = before


def reset_peak(device: torch.device | str) -> None:
    """Starts this process's peak of reserved bytes afresh (`reserved_peak`)."""
    torch.cuda.reset_peak_memory_stats(torch.device(device))


def reserved_peak(device: torch.device | str) -> int:
    """The most bytes this process's allocator reserved since `reset_peak`: what a workload's grant was spent on
    here (check._memory_hold records it beside the worker's own peak; the two do not add up exactly: the worker's
    view of the shared sets lives in this process's reservation (CUDA IPC), and contexts are outside both)."""
    return int(torch.cuda.max_memory_reserved(torch.device(device)))
