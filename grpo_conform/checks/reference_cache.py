"""The float64 reference of one pristine input set, computed once and reused by every judged call
on it (docs/checks.md, "Judging cost: what is computed once").

What a judgment needs besides the gradient's own reference values depends only on the pristine
inputs and the call's parameters, never on the implementation's outputs: the float64 log-probs
(logits, ids, temperature), the reference loss, the bound of an fp32 kernel's log-prob error and,
per row, max|z|/T (the fp32 floor) and min(1 - p_t, V 2^-24) (the target floor). Before, every
judged call computed the log-probs twice (loss, then gradient), the error bound, the row maxima
twice and a float64 log-sum-exp of every row once more, for each call again, though calls B, D
(judged twice), the two non-leaf calls, the retained graph's two backwards and the upstream
scalars' calls share their inputs. Now they are computed on the first judgment of an input set and
kept, keyed by the slot (its name and serial: a set made again under a name is another), its
`version` (bumped by every `InputSlot.commit`, so any change of the inputs is a new key) and the
parameters; a different upstream scalar reuses them scaled. The values are the ones the first
judgment computed, chunk for chunk, so verdicts are unchanged.

A second shortcut (`Memo`): a call whose outputs are bitwise equal to those of a judged call on the
same inputs (same slot version, parameters and upstream scalar) gets that call's comparisons: the
judgment is a function of those bytes and the reference alone. Outputs that differ by one bit are
judged in full. The implementation cannot steer this: the key and the kept copy of the judged
outputs are the parent's, and equality is bitwise.

Cost attribution (`phases`): the reference's float64 passes run under `reference` (inside
`judge`), reuses are tallied as `reference-reused` and `judge-reused`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch

from grpo_conform.compare import bitwise_equal
from grpo_conform.phases import PHASES

LIMIT = 8  # entries kept (each holds [batch, seq] grids and per-row vectors: kilobytes)
MEMO_MAX_BYTES = 5 * 2**29  # 2.5 GiB: outputs larger than this are not copied for the memo (batch 16 and up on a GPU)


def params_key(values: dict[str, Any]) -> Hashable:
    return tuple(sorted((k, repr(v)) for k, v in values.items()))


@dataclass
class Entry:
    """What one (input set, parameters) pair needs, filled as the first judgment computes it."""

    loss: float | None = None
    logp_error: Any = None  # [B, S] tensor, None where the loss needs no log-probs
    logp_error_known: bool = False
    rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # (start, stop) -> (m, rest)


class ReferenceCache:
    """Per workload run (`WorkloadConformance.refs`). `slot_key` is (slot name, serial, version)."""

    def __init__(self) -> None:
        self._logp: OrderedDict[Hashable, torch.Tensor | None] = OrderedDict()
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self.memo = Memo()

    @staticmethod
    def _put(table: OrderedDict, key: Hashable, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > LIMIT:
            table.popitem(last=False)

    def logp(self, slot_key: Hashable, temperature: float, compute) -> torch.Tensor:
        """The float64 log-probs of the slot's pristine inputs at `temperature`."""
        key = (slot_key, float(temperature))
        if key in self._logp:
            PHASES.tally("reference-reused")
            return self._logp[key]
        with PHASES("reference"):
            value = compute()
        self._put(self._logp, key, value)
        return value

    def seed_logp(self, slot_key: Hashable, temperature: float, logp: torch.Tensor | None) -> None:
        """Log-probs the input generator computed of exactly these inputs (members with old or
        reference log-probs draw them from logp): the first judgment need not compute them again."""
        if logp is not None:
            self._put(self._logp, (slot_key, float(temperature)), logp)

    def carry_logp(self, old_key: Hashable, new_key: Hashable, temperature: float, move=None) -> None:
        """The log-probs already computed for `old_key`'s inputs, kept for `new_key`'s: a commit that changed no
        input they read (the advantages alone), or moved them as `move` does (sequences rotated), needs no second
        float64 pass. Nothing where none were computed."""
        value = self._logp.get((old_key, float(temperature)))
        if value is not None:
            self.seed_logp(new_key, temperature, value if move is None else move(value))

    def entry(self, slot_key: Hashable, values: dict[str, Any]) -> Entry:
        key = (slot_key, params_key(values))
        if key not in self._entries:
            self._put(self._entries, key, Entry())
        else:
            self._entries.move_to_end(key)
        return self._entries[key]


class Memo:
    """The last judged call's outputs (a copy the parent owns) and its comparisons, by key."""

    def __init__(self) -> None:
        self.key: Hashable | None = None
        self.loss: float = math.nan
        self.grads: dict[str, torch.Tensor] = {}
        self.result: Any = None

    def lookup(self, key: Hashable, loss: float, grads: dict[str, torch.Tensor]) -> Any:
        if self.key != key or self.result is None or set(grads) != set(self.grads):
            return None
        same_loss = loss == self.loss or (math.isnan(loss) and math.isnan(self.loss))
        if same_loss and all(bitwise_equal(g, self.grads[n]) for n, g in grads.items()):
            PHASES.tally("judge-reused")
            return self.result
        return None

    def store(self, key: Hashable, loss: float, grads: dict[str, torch.Tensor], result: Any) -> None:
        size = sum(g.numel() * g.element_size() for g in grads.values())
        self.key, self.result, self.grads = None, None, {}
        if size > MEMO_MAX_BYTES:
            return
        self.key, self.loss, self.result = key, loss, result
        self.grads = {n: g.detach().clone() for n, g in grads.items()}
