"""What a check run will do, decided before anything runs: implementations (folders expanded,
`--changed-since` applied) x resolved spec members (`--member`) x workloads (`--workload`, the
device, `--shard`), and which checks are reported (`-k/--check`).

Every workload that is not run is kept with its reason, so the report and the records say what
they cover (issue 16 point 4).
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_conform.checks.registry import CHECKS_BY_NAME, TIMING_CHECKS
from grpo_conform.gate.changed import changed_implementations
from grpo_conform.gate.selection import ALWAYS_REPORTED, EXTENDED_REASON, WORKLOAD_REASON, SelectionError
from grpo_conform.gate.shard import apply_units, shard_units
from grpo_conform.implementations import Implementation, load_implementation
from grpo_conform.results import CheckOutcome, NotRun
from grpo_conform.spec import Spec, Workload, is_family_document, load_spec, read_document, specs_for_manifest
from grpo_conform.spec.find import resolve_spec_option



DEADLINE_REASON = "not run: --deadline reached before it started"


class Stop:
    """Set once (--fail-fast, an interrupt, or --deadline passing): what is not started after it is
    reported as not run. `deadline` is a time.monotonic() value; the reason appears once it passes."""

    def __init__(self, reason: str | None = None, deadline: float | None = None, clock=time.monotonic):
        self._reason, self.deadline, self._clock = reason, deadline, clock

    @property
    def reason(self) -> str | None:
        if self._reason is None and self.deadline is not None and self._clock() >= self.deadline:
            self._reason = DEADLINE_REASON
        return self._reason

    @reason.setter
    def reason(self, value: str | None) -> None:
        self._reason = value

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - self._clock())


@dataclass(frozen=True)
class MemberPlan:
    spec: Spec
    workloads: tuple[Workload, ...]  # to run, in the spec's order
    not_run: tuple[NotRun, ...] = ()

    @property
    def label(self) -> str:
        return self.spec.member or self.spec.id


@dataclass(frozen=True)
class ImplPlan:
    impl: Implementation
    arg: str  # the path as given (after folder expansion): the stable key shards and merges use
    members: tuple[MemberPlan, ...]
    skip: str | None = None  # decided without running: missing requirement, device not declared, ...
    checks: tuple[str, ...] = ()  # the -k selection, resolved to names (empty: all)

    def units(self) -> list[tuple[str, str, str]]:
        if self.skip or not any(m.workloads for m in self.members):
            return [(self.arg, "", "")]  # a pseudo-unit, so the implementation lands in exactly one shard
        return [(self.arg, m.label, w.name) for m in self.members for w in m.workloads]


@dataclass(frozen=True)
class Plan:
    implementations: tuple[ImplPlan, ...]
    specs: dict[str, Spec]
    notes: tuple[str, ...] = ()
    costs: dict[tuple[str, str, str], float] = field(default_factory=dict)


# -- checks (-k) ------------------------------------------------------------------------------------
def resolve_checks(patterns: tuple[str, ...]) -> tuple[str, ...]:
    if not patterns:
        return ()
    chosen: list[str] = []
    for pat in patterns:
        hits = [n for n in CHECKS_BY_NAME if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise SelectionError(f"--check {pat!r} matches no check (known: {', '.join(CHECKS_BY_NAME)}); "
                                 "use a check name or a pattern such as 'gradient*'")
        chosen += [h for h in hits if h not in chosen]
    return tuple(chosen)


def select_outcomes(outcomes: tuple[CheckOutcome, ...], patterns: tuple[str, ...]) -> tuple[CheckOutcome, ...]:
    names = resolve_checks(patterns)
    if not names:
        return outcomes
    return tuple(o for o in outcomes if o.check in names or o.check in ALWAYS_REPORTED)


def wants_timing(patterns: tuple[str, ...]) -> bool:
    names = resolve_checks(patterns)
    return not names or any(n in TIMING_CHECKS for n in names)


# -- implementations ----------------------------------------------------------------------------------
def expand_paths(paths: tuple[str, ...]) -> list[str]:
    """A folder without implementation.toml whose subfolders have one stands for those subfolders
    (`grpo-conform check implementations/`), in name order."""
    out: list[str] = []
    for p in paths:
        folder = Path(p)
        if folder.is_dir() and not (folder / "implementation.toml").exists():
            subs = sorted(c for c in folder.iterdir() if (c / "implementation.toml").is_file())
            if subs:
                out += [str(c) for c in subs]
                continue
        out.append(p)
    return out


def specs_of(impl: Implementation, spec_path: str | None, cache: dict[str, tuple[Spec, ...]],
             members: tuple[str, ...] = ()) -> tuple[Spec, ...]:
    """The specs an implementation is checked against. `--spec FILE` replaces the manifest's spec; a
    family file takes the manifest's members, or (a manifest without members) the `--member` names."""
    claimed = tuple(getattr(impl.manifest, "members", ()) or ())
    key = f"{spec_path}|{impl.manifest.spec}|{','.join(claimed)}|{','.join(members)}"
    if key not in cache:
        resolved = resolve_spec_option(spec_path) if spec_path else None  # `--spec ID` as well as `--spec FILE`
        if isinstance(resolved, Spec):  # a member or standalone id: that one spec, as a standalone file would
            cache[key] = (resolved,)
            return cache[key]
        spec_path = resolved
        target: Any = impl
        family = bool(spec_path) and is_family_document(read_document(spec_path))
        if spec_path and not family:  # a standalone spec file replaces whatever the manifest claims
            cache[key] = (load_spec(spec_path),)
            return cache[key]
        if family and not claimed and members:
            names = tuple(m.split("/")[-1].split("@")[0] for m in members)  # `grpo/token-is@1.0.0` -> token-is
            target = impl.manifest.model_copy(update={"members": names})
        cache[key] = tuple(specs_for_manifest(target, spec_path))
    return cache[key]


def member_matches(spec: Spec, wanted: str) -> bool:
    return wanted in {spec.id, spec.member or "", f"{spec.id}@{spec.version}"}


def missing_requirements(impl: Implementation) -> list[str]:
    return impl.missing_requirements()  # found without importing anything (issue 11)


def _workloads(spec: Spec, wanted: tuple[str, ...], device: str,
               extended: bool = False) -> tuple[list[Workload], list[NotRun]]:
    run, not_run = [], []
    for w in spec.workloads:
        if wanted and w.name not in wanted:
            not_run.append(NotRun(w.name, WORKLOAD_REASON, "deselected"))
        elif not wanted and not extended and w.tier == "extended":
            not_run.append(NotRun(w.name, EXTENDED_REASON, "deselected"))
        elif device not in w.devices:
            not_run.append(NotRun(w.name, f"not run on {device} (the spec runs it on {', '.join(w.devices)})",
                                  "device"))
        else:
            run.append(w)
    return run, not_run


def build_plan(request, device) -> Plan:
    checks = resolve_checks(request.checks)
    args = expand_paths(tuple(request.paths))
    impls = [(a, load_implementation(a)) for a in args]  # every manifest checked before anything runs
    notes: list[str] = []
    if request.changed_since:
        selected, note = changed_implementations([a for a, _ in impls], request.changed_since, request.spec_path)
        notes.append(note)
        impls = [(a, i) for a, i in impls if a in selected]
    cache: dict[str, tuple[Spec, ...]] = {}
    plans: list[ImplPlan] = []
    specs: dict[str, Spec] = {}
    seen_members: set[str] = set()
    seen_workloads: set[str] = set()
    for arg, impl in impls:
        members: list[MemberPlan] = []
        for spec in specs_of(impl, request.spec_path, cache, tuple(request.members)):
            if request.members and not any(member_matches(spec, m) for m in request.members):
                continue
            seen_members |= {m for m in request.members if member_matches(spec, m)}
            seen_workloads |= {w.name for w in spec.workloads}
            specs[spec.identity] = spec
            run, not_run = _workloads(spec, tuple(request.workloads), device.type, getattr(request, "extended", False))
            if not run and all(n.kind == "deselected" for n in not_run):
                continue  # --workload named none of this member's workloads: not asked for
            members.append(MemberPlan(spec, tuple(run), tuple(not_run)))
        if not members:
            continue  # --member named none of its members: not asked for
        plans.append(ImplPlan(impl, arg, tuple(members), _skip_reason(impl, members, device.type), checks))
    unknown = [m for m in request.members if m not in seen_members]
    if unknown:
        raise SelectionError(f"--member {unknown[0]!r}: no implementation checked here declares it")
    missing = [w for w in request.workloads if w not in seen_workloads]
    if missing:
        for _, impl in impls[:1]:
            specs_of(impl, request.spec_path, cache, tuple(request.members))[0].workload(missing[0])  # the spec's error, naming the known
    plan = Plan(tuple(plans), specs, tuple(notes))
    if request.shard:
        plan = shard_units(plan, request.shard, device.type)
    if request.units:
        plan = apply_units(plan, set(map(tuple, request.units)), "run in another slot")
    return plan


def _skip_reason(impl: Implementation, members: list[MemberPlan], device: str) -> str | None:
    missing = missing_requirements(impl)
    if missing:
        return (f"needs {', '.join(missing)}, which is not installed "
                f"(see {impl.path / 'implementation.toml'}: requires)")
    if device not in impl.manifest.devices:
        return f"declares devices {list(impl.manifest.devices)}; this run is on {device}"
    if not any(m.workloads for m in members):
        return f"no workload of spec {', '.join(m.label for m in members)} runs on {device}"
    return None
