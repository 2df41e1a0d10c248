"""What the fused reference computes once per input set, and its float64 GEMM counts (docs/fused-kernel.md,
"Check time").

A judged call of grpo-fused-linear needs, from the same pristine inputs, the reference loss, the error
model (`tolerance.gemm_allowance`) and the reference gradients. Each starts from the float64 log-sum-exp of
every row over the whole vocabulary, a GEMM pass of 2NHV FLOPs (N rows, H hidden, V vocabulary): before
this memo a judged call made that pass three times, and the error model (three passes) was made again for
every judgment of the same inputs (the tied-weights probe, forward-only calls, timed re-checks).

`state(x)` is the per-input-set record those results are kept in (its users key their entries by
parameters, blocks and dtype). Its key is the identity of every tensor of `x` together with torch's
version counter of each (bumped by every in-place write through torch: `InputSlot.commit` copies new
contents into the pristine tensors with `copy_`), their data pointers, shapes, strides and dtypes. The tensors are
held weakly: a tensor that dies drops its entries, so a new tensor at a reused address never meets an
old entry. The engine hands the reference only its parent-owned pristine copies (checks/buffers.py),
which no implementation can write; the implementation's outputs never enter a key or a value. The
engine's input generator draws into those pristine copies (`InputSlot.publish` then copies them out), so
its own row pass is of exactly the judged values and is kept here too (`reference.keep_generated`). Tensors
without a version counter (inference-mode tensors) are never memoised. The values kept are the ones the
first computation made, so every later result is bitwise the same as a recomputation.

`COUNTS` tallies the float64 GEMM FLOPs of the reference by pass kind (`count`), for the cost model and
for tests/test_fused_cost.py, which fails when a pass is repeated for one input set.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Hashable, Mapping

import torch

LIMIT = 4  # input sets kept (each: [B, T] grids, per-row and per-vocabulary-row vectors: megabytes)
COUNTS: dict[str, int] = {}  # pass kind -> float64 GEMM FLOPs since the last `reset_counts`
_entries: "OrderedDict[Hashable, tuple[list[weakref.ref], dict[str, Any]]]" = OrderedDict()


def count(kind: str, flops: int) -> None:
    COUNTS[kind] = COUNTS.get(kind, 0) + int(flops)


def reset_counts() -> None:
    COUNTS.clear()


def clear() -> None:
    """Forget every memoised input set (tests)."""
    _entries.clear()


def _tensor_key(t: torch.Tensor) -> tuple:
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))


def state(x: Mapping[str, Any]) -> dict[str, Any]:
    """The memo of input set `x`, a dict its users key by what else their result depends on
    (parameters, blocks, dtype). A fresh dict where nothing is kept yet, or where `x` holds a tensor
    without a version counter (then nothing is remembered)."""
    tensors = sorted(((k, v) for k, v in x.items() if isinstance(v, torch.Tensor)), key=lambda kv: kv[0])
    try:
        full = tuple((k, _tensor_key(v)) for k, v in tensors)
    except RuntimeError:  # inference tensors have no version counter
        return {}
    found = _entries.get(full)
    if found is not None:
        refs, value = found
        if all(r() is t for r, (_, t) in zip(refs, tensors)):
            _entries.move_to_end(full)
            return value
        del _entries[full]
    value: dict[str, Any] = {}
    _entries[full] = ([weakref.ref(t, lambda _r, k=full, table=_entries: table.pop(k, None)) for _, t in tensors], value)
    while len(_entries) > LIMIT:
        _entries.popitem(last=False)
    return value
