"""The conformance run of one workload: the probes of the workload's profile, run in order
against one worker, every call judged in the parent.

The engine here owns the buffers and the primitive steps a probe uses:
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
from functools import cached_property
from typing import Any, Callable

import torch

from grpo_conform.checks import internal, local_inputs
from grpo_conform.checks.book import CheckBook
from grpo_conform.checks.buffers import (InputSlot, OutputSlot, UndrawnInputSet, input_dtypes, only_gradient,
                                         overlap_text, storage_overlaps)
from grpo_conform.checks.reference_cache import ReferenceCache
from grpo_conform.checks.registry import CONFORMANCE_CHECKS
from grpo_conform.checks.units import judge_units
from grpo_conform.checksum import keyed_checksum
from grpo_conform import device_memory
from grpo_conform.dtypes import dtype_name, torch_dtype
from grpo_conform.compare import GradientComparisons, LossComparison
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_logits.inputs import COVERAGE_DRAWS
from grpo_conform.ops.grpo_logits.judge import NO_ROWS
from grpo_conform.ops.grpo_logits.reference import reference_logprobs
from grpo_conform.ops.grpo_terms import token_terms
from grpo_conform.phases import PHASES
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.results import INTERNAL_ERROR
from grpo_conform.spec import ResolvedWorkload, Spec

PLAIN = ("runs", "contract", "loss", "gradient", "gradient-row-sums", "last-row-zero", "finite",
         "no-mutation", "no-aliasing")
# What every judged call feeds besides its own check: whether it returned, whether it changed or
# shares storage with its inputs, and (its outputs kept for the end re-read) no-output-reuse.
CALL = ("runs", "no-mutation", "no-aliasing", "no-output-reuse")
# Properties of d logits rows: not applicable to an operation whose spec gives no logits (seq_next absent).
LOGITS_ROW_CHECKS = ("gradient-row-sums", "last-row-zero")
GONE = ("timeout", "crash", "cuda-error", "protocol")
KEEP_FRACTION_CUDA = 0.25  # of the GPU's memory: how much the worker may keep of earlier outputs


def everywhere(spec: Spec) -> str | None:
    return None


@dataclass(frozen=True)
class Probe:
    """One step of a conformance run, as the engine is handed it (the registry: checks/probes.py).

    `feeds`: every check the probe records findings for. `-k` selects probes by it, so it must be
    complete: a finding outside it is noted in the workload's draws (`undeclared_findings`, which the
    gallery tests refuse). `own`: the checks the probe alone stands for; when `applies(spec)` gives
    a reason, they are not applicable to the member (left out of the outcomes, the reason kept in the
    draws) and the probe does not run. `needs`: earlier probes whose results (`run.state`, the input
    set Q) it reads; a selection that keeps a probe keeps what it needs."""

    name: str
    summary: str
    run: Callable[["WorkloadConformance"], None]
    feeds: tuple[str, ...]
    own: tuple[str, ...] = ()
    applies: Callable[[Spec], str | None] = everywhere
    needs: tuple[str, ...] = ()


class WorkerGone(Exception):
    def __init__(self, failure: WorkerFailure):
        self.failure = failure


@dataclass
class Call:
    label: str
    slot: InputSlot
    upstream: float
    loss: float
    loss_desc: dict[str, Any] | None
    grad_descs: dict[str, dict[str, Any] | None]  # the worker's description of each gradient, by input
    grads: dict[str, torch.Tensor]  # the output slot's buffers: valid until the next export into that slot
    skipped_backward: str | None
    kept: bool = False

    @property
    def missing(self) -> list[str]:
        """The inputs backward left no gradient on (every gradient the output slot holds is expected)."""
        return [name for name in self.grads if self.grad_descs.get(name) is None]

    @property
    def grad(self) -> torch.Tensor:
        """The only gradient (probes of a single-gradient operation read it by this name)."""
        return self.grads[self._only()]

    @property
    def grad_desc(self) -> dict[str, Any] | None:
        return self.grad_descs.get(self._only())

    def _only(self) -> str:
        if len(self.grads) != 1:
            raise ValueError(f"call {self.label} has gradients {sorted(self.grads)}: name one (Call.grads)")
        return next(iter(self.grads))


@dataclass
class Kept:
    label: str
    fingerprint: tuple[int, int]  # (the loss's float64 bits, the gradients' keyed checksum)


#: the slots made on first use (`WorkloadConformance.__getattr__`)
LAZY_SLOTS = ("Q", "K", "out2", "X3", "X4", "X5")


@dataclass
class WorkloadConformance:
    session: WorkerSession
    spec: Spec
    rw: ResolvedWorkload
    seeds: list[int]
    probes: tuple[Probe, ...]  # what `run` runs, in order (probes.select); () for judging only
    profile: str = "full"  # the workload's probe profile: named where a check it leaves out is skipped
    draws: dict[str, Any] = field(default_factory=dict)

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

    def _label(self, label: str) -> str:
        self._count += 1
        return f"{self.slot_tag}{':' if self.slot_tag else ''}{label}#{self._count}"

    def _fail(self, checks: tuple[str, ...], label: str, failure: WorkerFailure) -> None:
        self.book.failure(checks, label, failure)
        if failure.kind in GONE:
            raise WorkerGone(failure) from None

    def ask(self, checks: tuple[str, ...], label: str, **request: Any) -> dict[str, Any] | None:
        """One worker request outside a loss call (a re-export, the effects, the holdings): its reply, or
        None with the failure recorded against `checks` (a gone worker raises WorkerGone, as `_fail`)."""
        try:
            return self.session.request(**request)
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            return None

    def forward(self, label: str, slot: InputSlot, checks: tuple[str, ...], *, grad: bool = True,
                leaf: str = "leaf", poison: str | None = None, inference: bool = False,
                tie: dict[str, Any] | None = None, only: tuple[str, ...] | None = None,
                same: dict[str, list[str]] | None = None, omit: list[str] | None = None,
                prefill: dict[str, Any] | None = None, deterministic: bool = False,
                autocast: str | None = None) -> dict[str, Any] | None:
        """Forward only; the inputs are compared with the pristine copy right after it.
        `inference`: under torch.inference_mode instead of torch.no_grad (with grad=False); `tie`: a
        second use of an input in the graph (the worker's `_tied`: tied input embeddings); `same`, `omit`:
        an input passed as another's tensor, optional inputs left out; `prefill`: leaves whose .grad holds an
        output slot's gradient before the forward; `deterministic`: under torch's deterministic mode (the
        worker's op_forward); `autocast`: the forward under torch.autocast in that dtype (trainer_modes.py)."""
        if not slot.drawn:
            raise UndrawnInputSet(f"call {label}: input set {slot.name} was never drawn (no probe before it wrote "
                                  "values there): a probe's order or `needs` is wrong")
        extra = {"inference": True} if inference else {}
        extra.update({"tie": tie} if tie else {})
        extra.update({"same": same} if same else {})
        extra.update({"omit": omit} if omit else {})
        extra.update({"prefill": prefill} if prefill else {})
        extra.update({"deterministic": True} if deterministic else {})
        extra.update({"autocast": autocast} if autocast else {})
        # `only`: the differentiable inputs that require grad this call (the others frozen, as a trainer's)
        names = [g.input for g in self.spec.gradients if only is None or g.input in only]
        # the worker's own copies (local_inputs.py), drawn for every call so the stream never shifts
        if self._local_draws.is_local(checks):
            extra["local"], shared = local_inputs.copied(slot.tensors, names, leaf, grad)
            self.draws.setdefault("local_calls", []).append(label)
            if shared:
                self.draws.setdefault("local_left_shared", {})[label] = shared
        try:
            reply = self.session.request(op="forward", call=label, inputs=slot.name, params=self.model.call_values,
                                         grad=grad, gradients=names, leaf=leaf, poison=poison, **extra)
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            self.mutation(label, slot, {"after error": slot.changes()})
            return None
        return {"loss": reply.get("loss"), "forward": slot.changes()}

    def backward(self, labels: list[str], upstream: list[float], checks: tuple[str, ...],
                 method: str = "backward", poison: str | None = None, retain: bool = False) -> dict[str, str] | None:
        """`retain`: retain_graph=True, so that a second backward through the same graph can follow."""
        extra = {"retain": True} if retain else {}
        try:
            reply = self.session.request(op="backward", calls=labels, upstream=upstream, method=method, poison=poison,
                                         **extra)
        except WorkerFailure as failure:
            self._fail(checks, "/".join(labels), failure)
            return None
        return reply.get("skipped") or {}

    def export(self, label: str, out: OutputSlot, checks: tuple[str, ...], keep: bool | None = None) -> dict | None:
        keep = len(self.kept) < self.keep_budget if keep is None else keep
        out.clear()
        try:
            reply = self.session.request(op="export", call=label, outputs=out.name, keep=keep)
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            return None
        return self._exported(label, out, keep, reply.get("report", {}))

    def _exported(self, label: str, out: OutputSlot, keep: bool, report: dict) -> dict:
        self.exported[out.name] = label
        if keep:
            self.kept.append(Kept(label, self.fingerprint(out)))
        return {"report": report, "kept": keep}

    def backward_export(self, label: str, slot: InputSlot, out: OutputSlot, checks: tuple[str, ...], fwd: dict,
                         upstream: float, method: str, poison: str | None,
                         keep: bool | None) -> tuple[dict[str, str], dict] | None:
        """`backward` then `export` of one call in one round trip (a worker request costs ~10 ms on the
        H200 host, docs/timing.md). Failures as the two requests reported them: a failed backward has the
        inputs checked after it, a failed export not."""
        keep = len(self.kept) < self.keep_budget if keep is None else keep
        out.clear()
        try:
            reply = self.session.request(op="backward", calls=[label], upstream=[upstream], method=method,
                                         poison=poison, export={"call": label, "outputs": out.name, "keep": keep})
        except WorkerFailure as failure:
            self._fail(checks, label, failure)
            if failure.error.get("phase") != "export":
                self.mutation(label, slot, {"forward": fwd["forward"], "after error": slot.changes()})
            return None
        return reply.get("skipped") or {}, self._exported(label, out, keep, reply.get("report") or {})

    def call(self, label: str, slot: InputSlot, out: OutputSlot, checks: tuple[str, ...], *,
             upstream: float = 1.0, method: str = "backward", leaf: str = "leaf",
             poison: str | None = None, keep: bool | None = None, only: tuple[str, ...] | None = None,
             same: dict[str, list[str]] | None = None, omit: list[str] | None = None,
             prefill: dict[str, Any] | None = None, deterministic: bool = False,
             autocast: str | None = None) -> Call | None:
        """forward + backward + export, with the mutation and aliasing checks of the call; `only`: the
        differentiable inputs that require grad (the call's gradients are those, the others frozen);
        `same`, `omit`, `prefill`, `deterministic`, `autocast`: as `forward`."""
        label = self._label(label)
        fwd = self.forward(label, slot, checks, leaf=leaf, poison=poison, only=only, same=same, omit=omit,
                           prefill=prefill, deterministic=deterministic, autocast=autocast)
        if fwd is None:
            return None
        done = self.backward_export(label, slot, out, checks, fwd, upstream, method, poison, keep)
        if done is None:
            return None
        skipped, exported = done
        self.book.record("runs", label, True, "every call returned")
        self.mutation(label, slot, {"forward": fwd["forward"], "backward": slot.changes()})
        report = exported["report"]
        self.aliasing(label, report)
        grads = out.grads if only is None else {k: v for k, v in out.grads.items() if k in only}
        return Call(label, slot, upstream, float(out.loss[0]), report.get("loss"), report.get("grads") or {},
                    grads, skipped.get(label), exported["kept"])

    def mutation(self, label: str, slot: InputSlot, changed: dict[str, Any]) -> None:
        found = {phase: diff for phase, diff in changed.items() if diff}
        if found:
            first_phase = next(iter(found))
            names = ", ".join(found[first_phase])
            self.book.record("no-mutation", label, False, f"call {label}: {names} changed during {first_phase}",
                             {"changes": found})
            slot.restore()
        else:
            self.book.record("no-mutation", label, True, "inputs bitwise unchanged after forward and backward")

    def aliasing(self, label: str, report: dict[str, Any]) -> None:
        overlaps = storage_overlaps(report.get("storage", {}), [t.name for t in self.spec.inputs],
                                    [g.input for g in self.spec.gradients])
        if overlaps:
            o = overlaps[0]
            self.book.record("no-aliasing", label, False,
                             f"call {label}: {overlap_text(o)}",
                             {"overlaps": overlaps})
        else:
            self.book.record("no-aliasing", label, True, "no output storage overlaps an input")

    # -- judging ----------------------------------------------------------------------------
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
