"""Calls whose inputs are the worker's own ordinary tensors (the worker's `local`, isolation/worker.py).

Every slot input lives in shared memory: a memfd mapped through torch.frombuffer on the CPU, a CUDA IPC
allocation on the GPU. Such a tensor differs from a trainer's in properties an implementation can read
for free: its storage is not resizable, a CPU one is page-aligned, each is a view (`_base`) of the whole
mapping. A kernel exact only there passed every call (red team 2026-12, gallery storage-resizable-tell:
the clip dropped unless an input's `untyped_storage().resizable()` is False). So some calls, drawn per
call from the run's seed with a stream of their own (the other draws do not move) and recorded in the
draws, hand over copies the worker makes with torch's allocator, laid out as the slot's, written back
after forward and after backward so the mutation check still sees every write. They are judged as the
others: a kernel that behaves differently on them fails whatever check that call feeds, and it cannot
know in advance which calls those are.

Bound: the copies of one call hold at most LOCAL_BYTES (smallest inputs first): on a large GPU workload
the small inputs are copied and the big differentiable ones stay shared, except where the leaf mode
already hands a fresh tensor (affine: a chain from the leaf; slice: `out[:, :-1]` of a longer copy), so
the non-leaf calls drawn local have every input local at no further cost.
"""

from __future__ import annotations

import random

import torch

#: checks whose calls are never local: they compare a call with the slot's earlier calls at the same addresses
#: (freshness: C rewrites A and B's buffers in place, V-name V0's; stale-output: A and B are the calls C follows).
#: A cache keyed on addresses (gallery memoize-by-pointer) never hit when A and B had fresh copies' addresses,
#: so C's results followed its new values and freshness passed it in about one run of six.
SAME_ADDRESS = ("freshness", "stale-output")
LOCAL_FRACTION = 0.3  # of the judged calls: ~30 a workload, so P(none local) < 1e-4
LOCAL_BYTES = 256 << 20  # copies of one call, on top of the workload's own buffers
SALT = 0x10CA1_C0B1E5


class LocalDraws:
    """Which calls of a workload are local: each eligible call (none of SAME_ADDRESS's checks) with probability
    LOCAL_FRACTION, and one of the first FIRST eligible calls, drawn, whatever the coin says: a narrowed run
    (`check -k`) makes few calls, and one of them must be local for a kernel that is wrong only there to show.
    One stream of its own from the workload's seed: the other draws never move."""

    FIRST = 3

    def __init__(self, seed: int):
        self._r = random.Random(seed ^ SALT)
        self._forced = self._r.randrange(self.FIRST)
        self._eligible = 0

    def is_local(self, checks: tuple[str, ...]) -> bool:
        coin = self._r.random() < LOCAL_FRACTION  # drawn for every call, eligible or not
        if set(checks) & set(SAME_ADDRESS):
            return False
        self._eligible += 1
        return coin or self._eligible - 1 == self._forced


def copied(tensors: dict[str, torch.Tensor], gradients: list[str], leaf: str, grad: bool,
           limit: int = LOCAL_BYTES) -> tuple[list[str], list[str]]:
    """(inputs the worker copies, inputs left shared for the bound): every input but those the leaf mode
    already copies, smallest storage first, while their total fits `limit`."""
    fresh: set[str] = set()
    if grad and leaf == "affine":
        fresh = set(gradients)
    elif grad and leaf == "slice":
        fresh = {n for n in gradients if tensors[n].dim() >= 3}
    todo = sorted((n for n in tensors if n not in fresh), key=lambda n: (tensors[n].untyped_storage().nbytes(), n))
    out, total = [], 0
    for name in todo:
        total += tensors[name].untyped_storage().nbytes()
        if total > limit:
            break
        out.append(name)
    return out, todo[len(out):]
