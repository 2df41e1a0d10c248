"""What must cross DRAM for one protocol of a spec member: the `traffic-v1` model (docs/floors.md).

A family member declares it (`traffic`: per protocol, the tensors read and written and which of
their rows: `all`, `scored` = logits positions t < S, `unmasked` = scored positions whose
completion_mask is 1). The frozen v1 file has no `traffic` field: `derived_traffic` derives it
from its semantics with the same rules (on-policy without mask or KL the forward is -mean(A) and
needs only the advantages; the gradient must always be written in full).

Unmasked rows are counted from the actual mask (`count_mask`, or a fraction); without one the
count is 0, which bounds every mask (the floor stays a lower bound, only a weaker one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from grpo_conform.errors import GrpoConformError
from grpo_conform.spec import ResolvedWorkload, Spec

ROWS = ("all", "scored", "unmasked")
PROTOCOLS_WITH_TRAFFIC = ("forward", "full", "full-scaled", "backward")
POSITION_AXES = ("seq_next", "seq")


class TrafficError(GrpoConformError):
    """A traffic declaration that cannot be counted (unknown tensor, rows on a tensor without positions)."""


@dataclass(frozen=True)
class MaskCount:
    """How many scored positions are unmasked, and (when known) how many sequences have any."""

    unmasked: int
    scored: int
    sequences_with_tokens: Optional[int] = None
    source: str = "mask"

    @property
    def fraction(self) -> float:
        return self.unmasked / self.scored if self.scored else 0.0


def count_mask(mask: Any) -> MaskCount:
    """Count a completion mask [batch, seq] (bool or int tensor, or nested lists): nonzero = counts."""
    import torch  # floors and `spec` commands use this module without torch

    m = torch.as_tensor(mask) != 0
    if m.dim() != 2:
        raise TrafficError(f"completion_mask: expected shape [batch, seq], got {list(m.shape)}")
    return MaskCount(int(m.sum()), m.numel(), int(m.any(dim=1).sum()), "mask")


def mask_count_for(resolved: ResolvedWorkload, unmasked: Union[None, float, MaskCount, Any]) -> Optional[MaskCount]:
    """Normalise what a caller knows about the mask: a MaskCount, a mask tensor, or a fraction in [0, 1]."""
    if unmasked is None or isinstance(unmasked, MaskCount):
        return unmasked
    if isinstance(unmasked, (int, float)) and not isinstance(unmasked, bool):
        if not 0.0 <= float(unmasked) <= 1.0:
            raise TrafficError(f"unmasked fraction {unmasked!r}: expected a number in [0, 1]")
        scored = resolved.axes["batch"] * resolved.axes["seq"]
        return MaskCount(math.floor(float(unmasked) * scored), scored, None, f"fraction {float(unmasked):g}")
    return count_mask(unmasked)


@dataclass(frozen=True)
class Item:
    tensor: str
    direction: str  # read | write
    rows: str = "all"


def _items(protocol: Any, direction: str) -> list[Item]:
    entries = getattr(protocol, direction, None)
    if entries is None and isinstance(protocol, dict):
        entries = protocol.get(direction, ())
    out = []
    for e in entries or ():
        tensor = e["tensor"] if isinstance(e, dict) else e.tensor
        rows = (e.get("rows", "all") if isinstance(e, dict) else e.rows) or "all"
        out.append(Item(tensor, direction, rows))
    return out


def derived_traffic(spec: Spec) -> dict[str, list[Item]]:
    """Traffic of a spec without a `traffic` field, derived from its semantics (the frozen v1 file)."""
    x = spec.differentiable_input
    names = [t.name for t in spec.inputs]
    masked = "completion_mask" in names or spec.terms.mask.present
    on_policy = "old_logprobs" not in names and not spec.terms.kl.present and not masked
    rows = "unmasked" if masked else "scored"
    outputs = [Item(o.name, "write") for o in spec.outputs]
    if on_policy and spec.semantics.family == "grpo":
        # the ratio is exactly 1: the loss is -mean(A), whatever the logits are
        forward = [Item(n, "read") for n in names if n == "advantages"] + outputs
    else:
        forward = [Item(n, "read", rows if n == x.name else "all") for n in names] + outputs
    full = [Item(n, "read", rows if n == x.name else "all") for n in names] + outputs
    full += [Item(f"grad:{g.input}", "write", "all") for g in spec.gradients]
    return {"forward": forward, "full": full, "full-scaled": list(full), "backward": []}


def declared_traffic(spec: Spec) -> Optional[dict[str, list[Item]]]:
    declared = getattr(spec, "traffic", None)
    if not declared:
        return None
    out = {p: _items(v, "read") + _items(v, "write") for p, v in declared.items()}
    if "full-scaled" not in out and "full" in out:
        out["full-scaled"] = list(out["full"])  # the same bytes move; only the scalar differs
    return out


def traffic_of(spec: Spec) -> tuple[dict[str, list[Item]], str]:
    """The member's traffic per protocol and where it comes from (`declared` or `derived`)."""
    declared = declared_traffic(spec)
    return (declared, "declared") if declared is not None else (derived_traffic(spec), "derived")


@dataclass(frozen=True)
class Counted:
    tensor: str
    direction: str
    rows: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    note: str = ""


def _tensor_info(spec: Spec, resolved: ResolvedWorkload, name: str, itemsize) -> tuple[tuple[str, ...], tuple[int, ...], str]:
    base = name.split(":", 1)[1] if name.startswith("grad:") else name
    for t in spec.inputs:
        if t.name == base:
            dtype = resolved.dtypes.get(t.name) or min(t.dtypes, key=itemsize)
            return t.shape, tuple(resolved.shapes[t.name]), dtype
    for o in spec.outputs:
        if o.name == base and not name.startswith("grad:"):
            return o.shape, tuple(resolved.axes[a] for a in o.shape), min(o.dtypes, key=itemsize)
    raise TrafficError(f"traffic names tensor {name!r}, which is not an input, output or grad:<input> of {spec.id}")


def count_item(spec: Spec, resolved: ResolvedWorkload, item: Item, mask: Optional[MaskCount], itemsize) -> Counted:
    """The bytes of one traffic item at this workload, its rows counted by the rule it names."""
    if item.rows not in ROWS:
        raise TrafficError(f"traffic of {spec.id}: rows {item.rows!r} for {item.tensor}: expected one of {ROWS}")
    axes, shape, dtype = _tensor_info(spec, resolved, item.tensor, itemsize)
    size = math.prod(shape) * itemsize(dtype)
    position = next((a for a in POSITION_AXES if a in axes), None)
    if item.rows == "all":
        return Counted(item.tensor, item.direction, "all", shape, dtype, size)
    seq = resolved.axes["seq"]
    if position is None:
        if item.rows == "scored":
            return Counted(item.tensor, item.direction, "scored", shape, dtype, size, "no position axis: all of it")
        if mask is None or mask.sequences_with_tokens is None or "batch" not in axes:
            return Counted(item.tensor, item.direction, "unmasked", shape, dtype, 0,
                           "no per-sequence mask count: 0 sequences assumed (bounds every mask)")
        per_seq = size // resolved.axes["batch"]
        return Counted(item.tensor, item.direction, "unmasked", shape, dtype, per_seq * mask.sequences_with_tokens,
                       f"{mask.sequences_with_tokens} sequences with an unmasked token")
    extent = shape[axes.index(position)]
    per_position = size // (extent * resolved.axes["batch"]) if "batch" in axes else size // extent
    scored = resolved.axes["batch"] * seq if "batch" in axes else seq
    if item.rows == "scored":
        note = f"positions t < {seq} only" if position == "seq_next" else ""
        return Counted(item.tensor, item.direction, "scored", shape, dtype, per_position * scored, note)
    if mask is None:
        return Counted(item.tensor, item.direction, "unmasked", shape, dtype, 0,
                       "no mask given: 0 unmasked positions assumed (bounds every mask)")
    if mask.scored != scored:
        raise TrafficError(f"the mask counts {mask.scored} scored positions; workload {resolved.name} has {scored}")
    return Counted(item.tensor, item.direction, "unmasked", shape, dtype, per_position * mask.unmasked,
                   f"{mask.unmasked:,} of {scored:,} positions unmasked ({mask.source})")
