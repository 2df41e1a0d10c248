"""The engine's judging, mixed into `WorkloadConformance` (conformance.py): a call's outputs against the float64
reference of the parent's pristine inputs (the upstream scalar applied to the reference, never to the
implementation's output), computed once per pristine content (reference_cache.py), and the keyed fingerprint of
kept outputs re-read at the workload's end."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from grpo_conform.checks.buffers import InputSlot, OutputSlot, only_gradient
from grpo_conform.checks.calls import Call
from grpo_conform.checks.units import judge_units
from grpo_conform.checksum import keyed_checksum
from grpo_conform.compare import GradientComparisons, LossComparison
from grpo_conform.ops.grpo_logits.reference import reference_logprobs
from grpo_conform.ops.grpo_terms import token_terms
from grpo_conform.phases import PHASES


class JudgeCalls:
    """Judging of a conformance run's calls (reads the run's op, spec, model, refs, tolerances and slots)."""

    @staticmethod
    def slot_key(slot: InputSlot) -> tuple[str, int, int] | None:
        """Names one pristine content: every commit bumps the version, and a slot made again under a name is a new
        serial (reference_cache.py). None for tensors outside an InputSlot: never cached."""
        return (slot.name, slot.serial, slot.version) if isinstance(slot, InputSlot) else None

    @cached_property
    def rows(self) -> Any:
        """The operation's judge of its one gradient row by row (`Operation.row_judge`; grpo-logits:
        ops/grpo_logits/judge.py), made when first asked: only where `error_model` gives None."""
        return self.op.row_judge(self)

    def _slot_of(self, x: dict[str, torch.Tensor]) -> InputSlot | None:
        """The input slot whose pristine copy `x` is (None: tensors of no slot, never cached)."""
        for value in (*self.__dict__.values(), *self.__dict__.get("shaped", ())):
            if isinstance(value, InputSlot) and value.pristine is x:
                return value
        return None

    def judge(self, call: Call, slot: InputSlot | None = None,
              upstream: float | None = None) -> tuple[LossComparison, GradientComparisons]:
        """(loss comparison, each gradient compared by name with the reference's gradient of that
        name) against the reference of the pristine inputs. Outputs bitwise equal to the last judged
        call's on the same pristine inputs, parameters and upstream scalar get its comparisons
        (reference_cache.Memo)."""
        with PHASES("judge"):
            slot = slot or call.slot
            c = call.upstream if upstream is None else upstream
            slot_key = self.slot_key(slot)
            if slot_key is None:
                return self._judge(call, slot, upstream)
            key = (slot_key, tuple(sorted((k, repr(v)) for k, v in self.model.values.items())), c)
            found = self.refs.memo.lookup(key, call.loss, call.grads)
            if found is not None:
                return found
            result = self._judge(call, slot, upstream)
            self.refs.memo.store(key, call.loss, call.grads, result)
            return result

    def _judge(self, call: Call, slot: InputSlot | None = None,
               upstream: float | None = None) -> tuple[LossComparison, GradientComparisons]:
        x = (slot or call.slot).pristine
        c = call.upstream if upstream is None else upstream
        model = self.op.error_model(self.spec, x, self.model.params, self.grad_dtype)
        if model is not None:  # every gradient by name, with the operation's derived allowance
            return self._judge_units(call, x, c, model)
        # No error model (grpo-logits): one gradient, judged by the operation's row judge under its name.
        name = only_gradient(self.spec)
        loss_cmp, cmp = self.rows.judge(call.loss, call.grads[name], x, c)
        return loss_cmp, GradientComparisons({name: cmp})

    def _logp(self, x: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The float64 log-probs of `x` at the model's temperature, once per pristine content."""
        params = self.model.params
        if not self.model.uses_logprobs(x):
            return None
        slot = self._slot_of(x)
        compute = lambda: reference_logprobs(x, params)  # noqa: E731
        if slot is None:
            with PHASES("reference"):
                return compute()
        return self.refs.logp(self.slot_key(slot), self.model.temperature, compute)

    def reference_loss(self, x: dict[str, torch.Tensor]) -> float:
        """The float64 reference loss of `x` (a slot's pristine copy: computed once per content)."""
        slot = self._slot_of(x)
        entry = None if slot is None else self.refs.entry(self.slot_key(slot), self.model.values)
        if entry is not None and entry.loss is not None:
            PHASES.tally("reference-reused")
            return entry.loss
        if self.seq_next is None:  # no given logits (grpo-fused-linear): the operation's own reference loss
            loss = self.model.loss(x)
        else:
            logp = self._logp(x)
            with PHASES("reference"):
                loss = float(token_terms(x, self.model.params, logp).loss.sum())
        if entry is not None:
            entry.loss = loss
        return loss

    def _judge_units(self, call: Call, x: dict[str, torch.Tensor], c: float, model: Any):
        """Each gradient by name, unit by unit, with the operation's derived allowance (checks/units.py)."""
        return judge_units(self.op, self.spec, self.rw, self.tol, self.model.params, x, call.loss, call.grads, c, model,
                           self.groupings, self.subnormal, self.model.loss(x))

    def loss_floor(self, x: dict[str, torch.Tensor]) -> float:
        """The absolute loss allowance `judge` gives, without the gradient (forward-only calls): an
        operation with its own error model, that model's loss allowance; else its row judge's (grpo-logits:
        the larger of T * the rows' fp32 floors of |dL/dlogp| and the derived move of the loss)."""
        model = self.op.error_model(self.spec, x, self.model.params, self.grad_dtype)
        if model is not None:
            return model.loss
        return self.rows.loss_floor(x)

    def fingerprint(self, out: OutputSlot) -> tuple[int, int]:
        """A keyed checksum of the loss and the gradients' bytes, the gradients in the spec's order
        as one byte string (the key never leaves the parent)."""
        with PHASES("input-checks"):
            return self._fingerprint(out)

    def _fingerprint(self, out: OutputSlot) -> tuple[int, int]:
        # (the loss's float64 bits, a keyed int64 sum of the gradients' bytes in the spec's order:
        # grpo_conform.checksum), read together: one wait for the device. Bits, so a NaN loss equals itself.
        total = keyed_checksum([out.grads[g.input] for g in self.spec.gradients], *self._key)
        bits = out.loss[0].to(torch.float64).reshape(1).view(torch.int64)
        loss_bits, total = torch.cat([bits, total.to(bits.device).reshape(1)]).tolist()
        return (loss_bits, total)
