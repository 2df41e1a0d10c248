"""`--jobs N` and `--gpus all|0,1`: the plan's work handed to slot processes on one host.

A slot is a process (`python -m grpo_conform.gate.slot`) that runs `run_check` on one job (one
implementation, or when there are more slots than implementations a part of one: whole members, and
single workloads of a member heavier than a job's share: `make_jobs`) and writes
its JSON report; the parent relays its progress lines and merges the reports
(grpo_conform.gate.merge). With `--gpus`, each GPU gets its own slots with CUDA_VISIBLE_DEVICES set
to that GPU alone (so the slot's parent-side tensors and its worker's CUDA IPC handles agree on
device 0). Slots on one GPU share it through the run's gate (gpu_share.py): their conformance runs side
by side within memory grants, each slot's timing waits until the GPU is its own. On CUDA `--jobs auto`
(the default) is up to AUTO_GPU_SLOTS slots per GPU.

Slots cannot reach each other's workers: each slot draws its workers' uids from its own block of
the worker uid range (`with_uid_blocks`, isolation/uids.py), so no worker can signal, ptrace or
read the private /proc files of another slot's. A slot whose worker was killed from outside
(isolation.session.WorkerKilled) exits 3; the run then fails with exit 3, blaming nobody.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from grpo_conform.phases import add as add_phases
from grpo_conform.errors import EXIT_ENVIRONMENT, EnvironmentProblem
from grpo_conform.gate.gpu_share import ENV_FDS as ENV_GATE_FDS, GpuArbiter, serve
from grpo_conform.gate.merge import Piece, impl_from_json, merge_implementations, pieces_from_report
from grpo_conform.gate.plan import SelectionError, Stop
from grpo_conform.gate.shard import apply_units, unit_cost
from grpo_conform.isolation import privilege, uids
from grpo_conform.provenance import device_info, software, utc_now
from grpo_conform.results import (CheckReport, Coverage, ImplementationResult, MemberResult, NotRun,
                                  implementation_result)


@dataclass(frozen=True)
class Slot:
    name: str  # "cpu1", "gpu0", "gpu0.2"
    env: dict[str, str]  # added to the slot's environment
    gpu: str | None = None  # the GPU (CUDA_VISIBLE_DEVICES name) it shares with the run's other slots on it


def parse_gpus(text: str) -> str | tuple[int, ...]:
    if text.strip() == "all":
        return "all"
    try:
        ids = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        ids = ()
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise SelectionError(f"--gpus {text!r}: expected 'all' or distinct GPU indices such as 0,1")
    return ids


def visible_gpus(count: int) -> list[str]:
    """What CUDA_VISIBLE_DEVICES to give for each index this process sees."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent:
        names = [x.strip() for x in parent.split(",") if x.strip()]
        return names[:count]
    return [str(i) for i in range(count)]


def plan_slots(device_type: str, gpus, jobs: int, timing: bool, gpu_count: int) -> tuple[list[Slot], list[str]]:
    """The slots of a run and notes on how they were chosen. Pure: tested on the CPU."""
    notes: list[str] = []
    if jobs < 1:
        raise SelectionError(f"--jobs {jobs}: expected 1 or more")
    if device_type != "cuda":
        if gpus is not None:
            raise SelectionError("--gpus needs --device cuda (or auto on a machine with CUDA)")
        return [Slot(f"cpu{i + 1}", {}) for i in range(jobs)], notes
    if gpus is None:
        gpus = (0,)
    ids = list(range(gpu_count)) if gpus == "all" else list(gpus)
    bad = [i for i in ids if i >= gpu_count]
    if bad or not ids:
        raise EnvironmentProblem(f"--gpus: GPU {bad[0] if bad else '?'} does not exist here ({gpu_count} visible)")
    names = visible_gpus(gpu_count)
    per_gpu = jobs
    if timing and jobs > 1:
        notes.append(f"--jobs {jobs}: {jobs} slots per GPU; their conformance runs side by side, and each slot "
                     "times its workloads with the GPU to itself, once no other slot has work on it")
    slots = []
    for i in ids:
        for k in range(per_gpu):
            slots.append(Slot(f"gpu{i}" + (f".{k + 1}" if per_gpu > 1 else ""), {"CUDA_VISIBLE_DEVICES": names[i]},
                              names[i] if per_gpu > 1 else None))
    return slots, notes


def with_uid_blocks(slots: list[Slot]) -> tuple[list[Slot], list[str]]:
    """Each slot's workers draw their uids from a block of the range no other slot uses. Only where
    uids are drawn (a root validator; GRPO_CONFORM_WORKER_USER unset): otherwise said in a note."""
    if len(slots) < 2:
        return slots, []
    if os.getuid() != 0:
        return slots, ["the slots' workers run as the validator's own user (not root): they can signal each other"]
    if os.environ.get(privilege.ENV_USER, "").strip():
        return slots, [f"{privilege.ENV_USER} names one user for every slot's workers: they can signal each other"]
    blocks = uids.split(*uids.uid_range(), len(slots))
    return [replace(s, env={**s.env, uids.ENV_UIDS: f"{lo}-{hi}"}) for s, (lo, hi) in zip(slots, blocks)], []


AUTO_JOBS_CAP = 4  # each CPU slot holds a parent, a zygote and a worker (the largest of them 0.6 GB in the main command)
AUTO_GPU_SLOTS = 4  # per GPU: the H200's default check, docs/timing.md ("Twelfth session")
CORES_PER_GPU_SLOT = 3  # a slot's parent, its worker, and the Triton compiles of a cold cache


def auto_jobs(plan, device_type: str, fail_fast: bool = False) -> int:
    """`--jobs auto` (the CLI's default): on the CPU one slot per usable core, at most one per member to
    run (a member split over slots repeats its per-member costs, `make_jobs`) and AUTO_JOBS_CAP; on
    CUDA up to AUTO_GPU_SLOTS per GPU, sharing it through the gate (gpu_share.py), one per
    CORES_PER_GPU_SLOT cores. A single slot runs in this process, as `--jobs 1` does. With
    `--fail-fast` one: a slot runs its job to the end, and the first failure must stop everything
    after it. The README's main command, 20 members on 2 cores: docs/timing.md."""
    if fail_fast:
        return 1
    members = sum(1 for p in plan.implementations if not p.skip for m in p.members if m.workloads)
    cores = len(os.sched_getaffinity(0))
    if device_type == "cuda":
        return max(1, min(cores // CORES_PER_GPU_SLOT, members, AUTO_GPU_SLOTS))
    return max(1, min(cores, members, AUTO_JOBS_CAP))


def make_jobs(plan, slots: int, device_type: str = "cpu") -> list[list[tuple[str, str, str]]]:
    """One job per implementation when there are at least as many implementations as slots. Otherwise
    each implementation gets a share of the slots by its weight (at least one) and its units are packed
    into that many jobs: whole members, but the workloads of a member heavier than a job's share one by
    one (`_pack`). Members stay whole because a worker process pays some costs once per member
    (`repeated-calls`' hundred calls, the member's kernels compiled or interpreted the first time), and a
    job per unit started a slot process and a worker per workload (~3 s of CPU each: 46 of them for the
    README's main command). Largest first, so the long ones start early. Weights are shard.unit_cost's
    for the run's device."""
    def weight(units) -> int:
        return sum(unit_cost(plan, u, device_type) for u in units)

    runnable = [p for p in plan.implementations if not p.skip]
    if len(runnable) >= slots:
        jobs = [p.units() for p in runnable]
    else:
        jobs = [g for p, k in zip(runnable, _shares(runnable, slots, weight)) for g in _pack(p, k, weight)]
    return sorted(jobs, key=lambda j: (-weight(j), j))


def _shares(runnable, slots: int, weight) -> list[int]:
    """Slots per implementation: one each, the rest one at a time to the heaviest per slot held (never
    more slots than the implementation has units)."""
    weights = [weight(p.units()) for p in runnable]
    share = [1] * len(runnable)
    for _ in range(slots - len(runnable)):
        open_ = [i for i, p in enumerate(runnable) if share[i] < len(p.units())]
        if not open_:
            break
        i = max(open_, key=lambda i: (weights[i] / share[i], -i))
        share[i] += 1
    return share


def _pack(p, k: int, weight) -> list[list[tuple[str, str, str]]]:
    """Units of implementation plan `p` in at most k jobs of about equal weight (greedy, heaviest first
    to the lightest job). A member stays whole unless it alone weighs more than a job's fair share
    (the total over k): then its workloads go one by one, so that one large member (token-is's
    thirteen CUDA workloads beside members of one or two) does not hold one slot while the others
    idle. With fewer members than slots some member is always over the share."""
    by_member: dict[str, list[tuple[str, str, str]]] = {}
    for u in p.units():
        by_member.setdefault(u[1], []).append(u)
    share = weight(p.units()) / k
    items: list[list[tuple[str, str, str]]] = []
    for units in by_member.values():
        items += [[u] for u in units] if weight(units) > share else [units]
    bins: list[list[tuple[str, str, str]]] = [[] for _ in range(min(k, len(items)))]
    load = [0] * len(bins)
    for item in sorted(items, key=lambda it: (-weight(it), it)):
        i = min(range(len(bins)), key=lambda i: (load[i], i))
        bins[i] += item
        load[i] += weight(item)
    return [sorted(b, key=p.units().index) for b in bins if b]


def _slot_request(request, units, device: str, shared_gpu: bool = False) -> dict:
    fields = asdict(request)
    fields.update(paths=[units[0][0]], device=device, units=[list(u) for u in units], jobs=1, gpus=None, shard=None,
                  changed_since=None, strict=False, shared_gpu=shared_gpu)  # --workload/--member kept
    return fields


class _Runner:
    def __init__(self, request, plan, device, say, slots, stop: Stop, check_one):
        self.request, self.plan, self.device, self.say, self.slots = request, plan, device, say, slots
        self.check_one = check_one  # check.check_implementation: returns at once for a stopped plan
        self.queue: queue.Queue = queue.Queue()
        self.stop = stop  # the run's (check.run_stop): --deadline counted from the start of the run
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}
        self.pieces: list = []
        self.parts: list[dict] = []
        self.environment: list[str] = []  # slots that stopped on an environment problem (exit 3)
        self.folder = Path(tempfile.mkdtemp(prefix="grpo-conform-slots-"))
        shared = {s.gpu for s in slots if s.gpu is not None and device.type == "cuda"}
        self.gates = {g: GpuArbiter(sum(1 for s in slots if s.gpu == g)) for g in shared}

    def run_job(self, slot: Slot, n: int, units) -> None:
        req, out = self.folder / f"job{n}.request.json", self.folder / f"job{n}.report.json"
        arbiter = self.gates.get(slot.gpu) if slot.gpu is not None else None
        fields = _slot_request(self.request, units, self.device.type, shared_gpu=arbiter is not None)
        if self.stop.deadline is not None:  # what is left of the run's --deadline, counted again in the slot
            fields["deadline"] = self.stop.remaining()
        req.write_text(json.dumps(fields))
        env = dict(os.environ, **slot.env)
        fds: tuple[int, ...] = ()
        if arbiter is not None:  # the slot's two pipe ends: grants in, requests out (gpu_share.py)
            grant_r, grant_w = os.pipe()
            request_r, request_w = os.pipe()
            fds = (grant_r, request_w)
            env[ENV_GATE_FDS] = f"{grant_r},{request_w}"
        try:
            proc = subprocess.Popen([sys.executable, "-m", "grpo_conform.gate.slot", str(req), str(out)], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True,  # a Ctrl-C reaches only us; we pass a SIGTERM on
                                    pass_fds=fds)
        except BaseException:
            if arbiter is not None:
                os.close(request_r)
                os.close(grant_w)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        server = None
        if arbiter is not None:
            server = threading.Thread(target=serve, args=(arbiter, f"{slot.name}#{n}", os.fdopen(request_r, "r"),
                                                          os.fdopen(grant_w, "w")), daemon=True)
            server.start()
        with self.lock:
            self.running[slot.name] = proc
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail = (tail + [line])[-20:]
            self.say.line(f"[{slot.name}] {line.split('] ', 1)[-1] if line.startswith('[') else line}")
        code = proc.wait()
        if arbiter is not None:
            arbiter.retire(f"{slot.name}#{n}")  # its holds dropped before this slot's next job asks for any
            if server is not None:
                server.join(5)  # ends at the pipe's end of file (a child still holding it: retired above)
        with self.lock:
            self.running.pop(slot.name, None)
        self._collect(slot, units, out, code, tail)

    def _collect(self, slot: Slot, units, out: Path, code: int, tail: list[str]) -> None:
        try:
            doc = json.loads(out.read_text())
        except (OSError, json.JSONDecodeError):
            doc = None
        if doc is None and code == EXIT_ENVIRONMENT:
            with self.lock:
                self.environment.append(f"[{slot.name}] " + next((t for t in reversed(tail) if t.startswith("error:")),
                                                                  " | ".join(tail[-3:])))
        if doc is None:
            self._lost(units, f"the slot process ({slot.name}) exited with {code} before writing its report: "
                              + " | ".join(tail[-5:]))
            return
        pieces = pieces_from_report(doc, f"{slot.name}:{out.name}")
        with self.lock:
            self.pieces += pieces
            self.parts.append(doc | {"slot": slot.name})
        if self.request.fail_fast and any(p.implementation.status == "failed" for p in pieces):
            name = pieces[0].implementation.name
            self.stop.reason = self.stop.reason or f"not run: --fail-fast stopped the run after {name} failed"

    def _lost(self, units, why: str) -> None:
        p = apply_units(self.plan, set(units), "run in another slot").implementations[0]
        members = [MemberResult(m.spec, "failed", why, (), _coverage_lost(m, why)) for m in p.members]
        with self.lock:
            self.pieces.append(Piece("lost", {}, implementation_result(p, members, {}, "failed", why)))

    def worker(self, slot: Slot) -> None:
        while True:
            try:
                n, units = self.queue.get_nowait()
            except queue.Empty:
                return
            if self.stop.reason:
                self._not_started(units)
                continue
            self.run_job(slot, n, units)

    def _not_started(self, units) -> None:
        p = apply_units(self.plan, set(units), "run in another slot").implementations[0]
        result = self.check_one(p, None, self.request, self.say, self.stop)  # returns at once: stopped
        with self.lock:
            self.pieces.append(Piece("stopped", {}, result))

    def terminate(self) -> None:
        with self.lock:
            procs = list(self.running.values())
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the slot closes its workers and removes its files
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _coverage_lost(m, why: str):
    return Coverage((), m.not_run + tuple(NotRun(w.name, why, "skipped") for w in m.workloads))


def run_slots(request, plan, device, say, stop: Stop, check_one) -> CheckReport:
    """The plan run by slot processes, merged into one report. `check_one` is the engine's
    check_implementation (handed in: the gate does not import the engine that calls it), used for
    implementations the plan skips and jobs a stop left unstarted."""
    gpu_count = torch.cuda.device_count() if device.type == "cuda" else 0
    slots, notes = plan_slots(device.type, request.gpus, request.jobs, request.timing, gpu_count)
    slots, uid_notes = with_uid_blocks(slots)
    notes += uid_notes
    started = utc_now()
    runner = _Runner(request, plan, device, say, slots, stop, check_one)
    for n, units in enumerate(make_jobs(plan, len(slots), device.type)):
        runner.queue.put((n, units))
    say.line(f"{len(slots)} slots ({', '.join(s.name for s in slots)}), {runner.queue.qsize()} jobs")
    for p in plan.implementations:
        if p.skip:
            runner.pieces.append(Piece("plan", {}, check_one(p, None, request, say, Stop())))
    threads = [threading.Thread(target=runner.worker, args=(s,), daemon=True) for s in slots]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short joins: a signal reaches the main thread between them
    except BaseException:
        runner.stop.reason = "not run: the run was interrupted"
        runner.terminate()
        raise
    finally:
        shutil.rmtree(runner.folder, ignore_errors=True)
    if runner.environment:
        raise EnvironmentProblem("a slot stopped on a problem of this machine, not of an implementation: "
                                 + "; ".join(runner.environment))
    merged = {(i.name, i.identity, i.path): i for i in merge_implementations(runner.pieces)}
    order = {str(p.impl.path): k for k, p in enumerate(plan.implementations)}
    impls = sorted((_real_specs(i, plan.specs) for i in merged.values()), key=lambda i: order.get(i.path, 1 << 30))
    parts = tuple(_part(doc, plan.specs) for doc in sorted(runner.parts, key=lambda d: d.get("started") or ""))
    first = parts[0] if parts else None
    hardware = first.hardware if first else {}
    phases: dict = {}
    for doc in runner.parts:  # each slot's own phases, summed (wall_s: the longest slot's)
        phases = add_phases(phases, doc.get("phases") or {})
    names = {str(p.device.get("name")) for p in parts}
    if len(names) > 1:
        notes.append(f"slots ran on different GPU models ({', '.join(sorted(names))})")
    return CheckReport(first.device if first else device_info(device), device.type == "cpu", tuple(impls),
                       plan.specs, started, utc_now(), first.software if first else software(), hardware,
                       request.strict, plan.notes + tuple(notes), request.shard, parts, phases)


def _real_specs(impl: ImplementationResult, specs: dict) -> ImplementationResult:
    members = tuple(replace(m, spec=specs.get(m.spec.identity, m.spec)) for m in impl.members)
    return replace(impl, members=members)


def _part(doc: dict, specs: dict) -> CheckReport:
    impls = tuple(_real_specs(impl_from_json(i), specs) for i in doc["implementations"])
    return CheckReport(doc.get("device", {}), bool(doc.get("triton_interpreter")), impls, specs, doc.get("started", ""),
                       doc.get("finished", ""), doc.get("software", {}), doc.get("hardware", {}))
