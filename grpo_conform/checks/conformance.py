"""The conformance run of one workload: the probes of the workload's profile, run in order
against one worker, every call judged in the parent.

The engine here owns the buffers and the primitive steps a probe uses (the worker steps are in
worker_calls.py, the judging in judge_calls.py, the call types in calls.py; all mixed in or re-exported here):
  - `call`: forward (the inputs checked bitwise after it), backward with an upstream scalar
    (through `loss.backward`-style autograd or `torch.autograd.grad`, from a leaf or a non-leaf
    view of the logits), export of the outputs into a parent-owned slot, then the inputs
    checked again and the storage ranges compared (no-mutation, no-aliasing);
  - `forward` / `backward` / `export` for probes that hold several graphs at once;
  - `judge`: the comparison with the float64 reference of the parent's pristine inputs, with the
    upstream scalar applied to the reference (never to the implementation's output);
  - `fingerprint`: a keyed checksum of a call's outputs, compared again when every kept output
    is re-read at the end of the workload.
The probes themselves (what each changes, which checks it feeds, where it applies) are data in
`probes.py`; the engine is handed the probes it runs (`probes.select`: a profile, narrowed by `-k`
before anything runs) and never imports that registry (probes and their judging import the engine).
Random choices (parameters, upstream scalars, rows, positions) come from the parent's seed and
are recorded in `draws`; the worker never sees a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_conform.checks import internal, local_inputs
from grpo_conform.checks.book import CheckBook
from grpo_conform.checks.calls import (  # noqa: F401  (CALL, PLAIN, Call: re-exported, the probes import them here)
    CALL, KEEP_FRACTION_CUDA, LOGITS_ROW_CHECKS, PLAIN, Call, Kept, Probe, WorkerGone,
)
from grpo_conform.checks.judge_calls import JudgeCalls
from grpo_conform.checks.worker_calls import WorkerCalls
from grpo_conform.checks.buffers import InputSlot, OutputSlot, input_dtypes
from grpo_conform.checks.reference_cache import ReferenceCache
from grpo_conform.checks.registry import CONFORMANCE_CHECKS
from grpo_conform import device_memory
from grpo_conform.dtypes import dtype_name, torch_dtype
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_logits.inputs import COVERAGE_DRAWS
from grpo_conform.ops.grpo_logits.judge import NO_ROWS
from grpo_conform.phases import PHASES
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.results import INTERNAL_ERROR
from grpo_conform.spec import ResolvedWorkload, Spec

LAZY_SLOTS = ("Q", "K", "out2", "X3", "X4", "X5")


@dataclass
class WorkloadConformance(WorkerCalls, JudgeCalls):
    session: WorkerSession
    spec: Spec
    rw: ResolvedWorkload
    seeds: list[int]
    probes: tuple[Probe, ...]  # what `run` runs, in order (probes.select); () for judging only
    profile: str = "full"  # the workload's probe profile: named where a check it leaves out is skipped
    draws: dict[str, Any] = field(default_factory=dict)
    # -x: no probe runs after one that failed a check of these (() any check; None: never stop)
    stop_at_failure: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seeds[0] ^ 0x9E3779B97F4A7C15)
        self.op = operation_for(self.spec)  # inputs, reference and sizes of the spec's operation
        self.model = ReferenceModel.drawn(self.spec, self.rng)
        self.draws["parameters"] = dict(self.model.values)
        # The first differentiable input (logits; hidden for grpo-fused-linear) sets the dtype of the
        # tolerance; `seq_next` is None for an operation without a left-over last position.
        first = self.spec.differentiable_input
        self.grad_dtype = self.rw.dtypes.get(first.name, first.dtypes[0])
        self.tol = self.spec.tolerance(self.grad_dtype)
        self.seq_next = self.rw.axes.get("seq_next")
        self.groupings = self.op.gradient_groupings(self.spec)
        self.width = self.groupings[first.name].width(self.rw)  # the elements of one unit (a row) judged together
        self.book = CheckBook(CONFORMANCE_CHECKS)
        info = torch.finfo(torch_dtype(self.grad_dtype))
        self.subnormal = 2.0 * info.tiny * info.eps  # values below the gradient dtype's range round to 0
        self.device = self.session.device
        self.kept: list[Kept] = []
        self._key = (self.rng.getrandbits(31) | 1, self.rng.getrandbits(31))
        _, grad_bytes = device_memory.set_and_gradient_bytes(self.spec, self.rw)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # what earlier workloads left cached here is the worker's to use
            free = device_memory.free_bytes(self.device)  # the workload's grant where slots share the GPU
            # Kept outputs, the parent's buffers (4 input/output sets, 2 pristine copies, 2 saved
            # gradients, the judged outputs' copy of reference_cache.Memo) and the implementation's
            # own working set all share the GPU.
            budget = max(0.0, KEEP_FRACTION_CUDA * free - 9 * grad_bytes)
        else:
            budget = 2 * 2**30
        # At least one kept output where the GPU holds a dozen gradients; none for huge workloads
        # (seq 65,536: 16.8 GB a gradient), whose smoke profile re-reads nothing.
        least = 1 if self.device.type != "cuda" or free > 12 * grad_bytes else 0
        self.keep_budget = max(least, int(budget // max(1, grad_bytes)))
        self._count = 0
        self._sets = 0  # input sets generated so far (the generators' `case`)
        self._mask_shift = self.rng.randrange(2)  # which other mask dtype Q gets (K the remaining one)
        self._local_draws = local_inputs.LocalDraws(self.seeds[0])  # which calls get local inputs
        self.exported: dict[str, str] = {}  # output slot -> the call last exported into it (Call.grad is that buffer)
        self.refs = ReferenceCache()  # the reference of each pristine input set, computed once (reference_cache.py)
        self.slot_tag = ""  # appended to the slot names and put before the call labels in another dtype's pass

    # -- the run ----------------------------------------------------------------------------
    def run(self):
        s = self.session
        dtypes = input_dtypes(self.spec, self.rw)
        self.dtypes = dtypes
        self.P = InputSlot.create(s, "P", self.rw.shapes, dtypes)
        self.out1 = OutputSlot.for_spec(s, "O1", self.spec, self.rw.shapes, dtypes)
        self.extra_slots: list[str] = []  # Q and O2 join when a probe first asks (see __getattr__)
        self.shaped: list[InputSlot] = []  # at_shape's input slots while they are in use (`_slot_of` finds them)
        self.state: dict[str, Any] = {}
        if self.seq_next is None:  # d logits' own properties: an operation without given logits has neither
            for check in LOGITS_ROW_CHECKS:
                self.book.not_applicable(check, f"{self.op.name}: {NO_ROWS}")
        probe = None
        try:
            for probe in self.probes:
                why = probe.applies(self.spec)
                if why:
                    for check in probe.own:
                        self.book.not_applicable(check, why)
                    continue
                before = self.book.marks()
                try:
                    with PHASES.inclusive("probes", probe.name):
                        probe.run(self)
                finally:
                    self._declared(probe, before)
                failed = None if self.stop_at_failure is None else self.book.first_failure(self.stop_at_failure)
                if failed:
                    self.draws["stopped_at_failure"] = {"check": failed, "probe": probe.name}
                    self.book.skip_rest(f"not run: --fail-fast stopped this workload when {failed} failed "
                                        f"(probe {probe.name})")
                    break
            if self.profile != "full":
                for check in CONFORMANCE_CHECKS:
                    self.book.skip(check, f"not exercised by this workload's '{self.profile}' probe profile")
            fed = {c for p in self.probes for c in p.feeds}
            for check in CONFORMANCE_CHECKS:
                if check not in fed:
                    self.book.skip(check, "not run: no probe of this run feeds it (left out by the -k selection)")
        except WorkerGone as gone:
            self.book.skip_rest(f"not run: the worker was lost ({gone.failure.kind}) before this check")
        except torch.OutOfMemoryError as exc:  # the validator's own buffers: never the implementation's fault
            self.state.clear()
            first = str(exc).splitlines()[0] if str(exc) else "CUDA out of memory"
            self.book.skip_rest(f"not judged: the validator ran out of GPU memory on this workload ({first[:160]})")
        except Exception as exc:  # grpo-conform's own bug: this workload's internal error, not the run's end
            if not internal.is_internal(exc):
                raise
            self.state.clear()
            where = f"probe {probe.name!r}" if probe is not None else "the conformance run"
            info = self.draws[INTERNAL_ERROR] = internal.describe(exc, where)
            self.book.internal_error(probe.feeds if probe is not None else (), internal.message(info), info)
        finally:
            self.state.clear()
            if self.device.type == "cuda":
                self._empty_cache()
            if self.book.inapplicable:
                self.draws["not_applicable"] = dict(self.book.inapplicable)
            if s.alive:  # the worker's mappings pin CUDA IPC memory in this process until dropped
                try:
                    s.request(op="drop")
                    held = s.request(op="unbind", slots=["P", "O1", *self.extra_slots]).get("held")
                    if held:  # storages the worker still holds: this process cannot free them (worker.op_unbind)
                        self.draws["held_after_unbind"] = held
                except WorkerFailure:
                    pass
                except Exception:  # the CUDA context already failed (the internal error above): nothing to drop
                    if INTERNAL_ERROR not in self.draws:
                        raise
        return self.book.outcomes()

    def _empty_cache(self) -> None:
        """torch.cuda.empty_cache, where a CUDA error no earlier call reported surfaces (an illegal memory access is
        sticky, and asynchronous: CUDA_LAUNCH_BLOCKING=1 still raised it here first in the float16 zero-advantage
        fault, H100 2026-12-06). Then nothing judged since that error can be trusted: every check not failed is not
        judged, with the error as this workload's internal error. An internal error recorded before it is kept as
        the first report (this one raised only because the context was already unusable)."""
        try:
            torch.cuda.empty_cache()
        except Exception as exc:
            if INTERNAL_ERROR in self.draws:
                return
            if not internal.is_internal(exc):
                raise
            info = self.draws[INTERNAL_ERROR] = internal.describe(exc, "the conformance run (a CUDA error that no "
                                                                       "earlier call reported)")
            self.book.internal_error(tuple(self.book.names), internal.message(info), info)

    def _declared(self, probe: Probe, before: dict[str, int]) -> None:
        """Findings outside the probe's `feeds` (a registry mistake: `-k` would leave the probe out)."""
        extra = sorted(c for c, n in self.book.marks().items() if n != before.get(c, 0) and c not in probe.feeds)
        if extra:
            self.draws.setdefault("undeclared_findings", {})[probe.name] = extra

    def release(self, name: str) -> None:
        """Lets go of input set `name` once no later probe reads it (V, after layouts), here and in the worker.
        V is a logits-sized buffer and its pristine copy; kept to the end it was alive at a batch-8 workload's peak
        beside K, which input-cases makes later (and trainer-shaped reads again) and which can now take V's memory
        (3.9 GiB of the 26.3 this process held; docs/timing.md, "Thirty-third session"). No kept output pins it: a
        kept call keeps its outputs, not its inputs (worker._export). A storage the worker still holds is recorded,
        as at the workload's end. A set made again under the name is a new one (`InputSlot.serial`)."""
        slot = self.__dict__.pop(name, None)
        if not isinstance(slot, InputSlot):
            return
        if slot.name in self.extra_slots:
            self.extra_slots.remove(slot.name)
        self.draws.setdefault("released", []).append(slot.name)
        reply = self.ask((), f"release {slot.name}", op="unbind", slots=[slot.name])
        if reply and reply.get("held"):
            self.draws.setdefault("held_after_release", []).extend(reply["held"])
        del slot
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # a buffer the worker opened waits in torch's IPC limbo until collected

    def __getattr__(self, name: str):
        # The second input set (and K, the input-cases probe's; X3-X5, the interleaved rounds' further graphs,
        # released after their round) and output slot are made when a probe first uses them: a smoke-profile
        # workload (16.8 GB of logits at seq 65,536) cannot afford six logits-sized buffers on one GPU.
        if name in LAZY_SLOTS and "dtypes" in self.__dict__:
            tag = self.slot_tag
            slot = (InputSlot.create(self.session, name + tag, self.rw.shapes, self.slot_dtypes(name)) if name != "out2"
                    else OutputSlot.for_spec(self.session, "O2" + tag, self.spec, self.rw.shapes, self.dtypes))
            self.__dict__[name] = slot
            self.extra_slots.append(slot.name)
            return slot
        raise AttributeError(name)

    # -- primitive steps --------------------------------------------------------------------
    def generate(self, slot: InputSlot, seed: int, profiles=None, given=None) -> None:
        # Old and reference log-probs follow the logits at this workload's drawn parameters. `case`
        # counts the workload's input sets: the generators rotate their layouts with it. `given`: inputs a
        # probe fixes, the rest drawn given them (`Operation.generate`).
        with PHASES("inputs"):
            self._generate(slot, seed, profiles, given)

    def _generate(self, slot: InputSlot, seed: int, profiles=None, given=None) -> None:
        values, case = self.model.values, self._sets
        self._sets += 1
        if slot.layout:  # views: generate contiguous values, then write them through the views
            x = self.op.generate(self.spec, self.rw, seed, self.device, profiles=profiles, values=values, case=case,
                                 given=given)
            slot.write(x.tensors)
        else:
            # drawn into the parent's pristine copies, which no implementation maps (the shared buffers can be
            # written by the worker at any time), then copied out: what the generator computes of the values
            # it drew is of exactly the judged inputs
            x = self.op.generate(self.spec, self.rw, seed, self.device, profiles=profiles, out=slot.pristine,
                                 values=values, case=case, given=given)
            slot.publish()
        self.op.keep_generated(slot.pristine, x)
        # the generator's float64 log-probs of exactly these values (members with old/ref log-probs)
        if self.slot_key(slot) is not None:
            self.refs.seed_logp(self.slot_key(slot), self.model.temperature, getattr(x, "logp", None))
        self.cover(x.covered)

    def cover(self, covered: dict[str, list[str]]) -> None:
        """What the input sets held, accumulated in `draws` (the coverage list reads it):
        mask_layouts, mask_dtypes, advantage_cases, special_ids (union) and input_sets_without_special_ids."""
        for key, name in COVERAGE_DRAWS:
            if key in covered:
                self.draws[name] = sorted(set(self.draws.get(name, ())) | set(covered[key]))
        if "special_ids" in covered:
            self.draws.setdefault("input_sets_without_special_ids", 0)
            self.draws["input_sets_without_special_ids"] += not covered["special_ids"]

    def slot_dtypes(self, name: str) -> dict[str, torch.dtype]:
        """The dtypes of input set `name`. The workload's own for P; the other sets take, in turn, the
        other dtypes a mask input allows, so every workload of a masked member passes every mask
        dtype the spec declares (bool, int64, int32) whatever its own."""
        dtypes = dict(self.dtypes)
        order = {"Q": 1, "K": 2}.get(name, 0)
        for t in self.spec.inputs:
            if order and self.op.input_kind(t.name) == "mask" and len(t.dtypes) > 1:
                others = [d for d in t.dtypes if d != dtype_name(dtypes[t.name])]
                dtypes[t.name] = torch_dtype(others[(order - 1 + self._mask_shift) % len(others)])
        return dtypes

    def made_in(self, probe: str) -> str | None:
        """For a probe made once per worker process and member (what it looks for is a property of the process or
        of the code, not of one workload): the workload where it already ran, or None, and it is recorded as
        running in this one. A restarted worker is a new session and makes it again."""
        made = self.session.__dict__.setdefault(f"{probe}_made", {})  # member identity -> workload
        where = made.get(self.spec.identity)
        if where is None:
            made[self.spec.identity] = self.rw.name
        return where
