"""`grpo-conform merge`: shard (or slot) outputs -> one verdict per implementation and member.

Inputs are our JSON reports (`check --format json`) and/or evidence records (`*.intoto.json`).
Pieces are grouped by implementation (name + identity) and spec member (identity). Refused, with
the files named: a workload reported twice for one implementation x member (duplicate), one
implementation folder with two identities or one member with two spec identities (the shards ran
different trees), pieces from different GPU models or software (python, torch, triton,
grpo-conform, CUDA runtime, commit). A workload that another shard was to run but no merged report
holds is reported as not run (and fails --strict).

Merge is a checker, not a concatenator (issue 29): every evidence record goes through `verify`
(envelope, signature against the shipped trust root or --trusted-keys, schema, semantics,
identities recomputed from this checkout) before a byte of it counts; one that does not verify
stops the merge, naming the step. JSON reports are unsigned (the shards' own output in one CI run):
their implementation identities are recomputed when the folder they name is in this checkout, and
a difference stops the merge; only records carry a signature.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from grpo_conform.errors import GrpoConformError
from grpo_conform.results import (CheckReport, Coverage, ImplementationResult, MemberResult, NotRun, WorkloadResult,
                                  coverage_from_json, implementation_status, member_message, member_status, workload_from_json,
                                  worst_status)


class MergeError(GrpoConformError):
    """Pieces that cannot be merged into one verdict: duplicates, conflicts, unreadable files."""


@dataclass(frozen=True)
class SpecRef:
    """A spec as a report names it (merged reports carry no spec document)."""

    id: str
    version: str
    identity: str
    source: str = ""
    member: str | None = None


@dataclass(frozen=True)
class Piece:
    origin: str  # the file it came from
    device: dict[str, Any]
    implementation: ImplementationResult
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MergeRequest:
    files: tuple[str, ...]
    strict: bool = False
    trusted_keys: str | None = None  # as verify's --trusted-keys (default: the shipped trust root)
    project: str | None = None  # the checkout identities are recomputed from (default: the current directory's)


# -- reading ---------------------------------------------------------------------------------------
def _kind(reason: str, given: str | None) -> str:
    if given:
        return given
    if "another shard" in reason or "another slot" in reason:
        return "elsewhere"
    if reason.startswith("not selected"):
        return "deselected"
    if reason.startswith("not run on "):
        return "device"
    return "skipped"


def _coverage(d: dict[str, Any]) -> Coverage:
    cov = coverage_from_json(d)
    raw = d.get("workloads_not_run", ())
    return replace(cov, not_run=tuple(NotRun(n.workload, n.reason, _kind(n.reason, r.get("kind")))  # type: ignore
                                      for n, r in zip(cov.not_run, raw)))


def _member_from_json(d: dict[str, Any]) -> MemberResult:
    s = d["spec"]
    spec = SpecRef(s["id"], s.get("version", ""), s["identity"]["sha256"], s.get("path", ""), s.get("member"))
    return MemberResult(spec, d["status"], d["message"], tuple(workload_from_json(w) for w in d.get("workloads", ())),
                        _coverage(d.get("coverage") or {}))


def impl_from_json(d: dict[str, Any]) -> ImplementationResult:
    members = tuple(_member_from_json(m) for m in d.get("members", ()))
    flat = tuple(w for m in members for w in m.workloads) or tuple(workload_from_json(w) for w in d.get("workloads", ()))
    return ImplementationResult(d["name"], d["path"], d["identity"]["sha256"], d.get("manifest", {}), d["status"],
                                d["message"], flat, d.get("worker", {}), members)


def pieces_from_report(doc: dict[str, Any], origin: str) -> list[Piece]:
    if not isinstance(doc, dict) or doc.get("tool") != "grpo-conform" or "implementations" not in doc:
        raise MergeError(f"{origin}: not a grpo-conform JSON report (expected the output of `check --format json`)")
    for impl in doc["implementations"]:
        if not impl.get("members"):
            raise MergeError(f"{origin}: implementation {impl.get('name')!r} has no per-member results; "
                             "re-run it with this version of grpo-conform")
    meta = {"shard": doc.get("shard"), "started": doc.get("started"), "finished": doc.get("finished"),
            "software": doc.get("software", {}), "hardware": doc.get("hardware", {}),
            "interpreter": doc.get("triton_interpreter", False)}
    try:
        return [Piece(origin, doc.get("device", {}), impl_from_json(i), meta) for i in doc["implementations"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise MergeError(f"{origin}: malformed report ({type(exc).__name__}: {exc})") from None


def pieces_from_record(path: str, trusted_keys: str | None = None, project: str | None = None) -> list[Piece]:
    # the evidence stack (cryptography, trust roots: ~1 s) only where a signed record is merged
    from grpo_conform.evidence.dsse import json_int
    from grpo_conform.evidence.records import RecordError
    from grpo_conform.evidence.verified import verified_payload

    try:
        payload = verified_payload(path, trusted_keys, project)
    except RecordError as exc:
        raise MergeError(str(exc)) from None
    statement = json.loads(payload, parse_int=json_int)  # as `verify` reads payloads
    p = statement.get("predicate", {})
    try:
        impl, spec = p["implementation"], p["spec"]
        ref = SpecRef(spec["id"], spec["version"], spec["identity"], "", spec.get("member"))
        workloads = tuple(workload_from_json(w) for w in p.get("workloads", ()))
        member = MemberResult(ref, p["verdict"], p.get("message", ""), workloads, _coverage(p.get("coverage") or {}))
        result = ImplementationResult(impl["name"], impl.get("path", ""), impl["identity"],
                                      {k: impl.get(k) for k in ("language", "license", "source", "description")},
                                      p["verdict"], p.get("message", ""), workloads, {}, (member,))
    except (KeyError, TypeError) as exc:
        raise MergeError(f"{path}: the record's predicate lacks {exc}; is it a grpo-conform record?") from None
    run = p.get("run", {})
    device = dict((p.get("hardware") or {}).get("device") or {})
    shard = (p.get("selection") or {}).get("shard") if isinstance(p.get("selection"), dict) else None
    return [Piece(path, device, result, {"started": run.get("started"), "finished": run.get("finished"),
                                         "shard": shard if isinstance(shard, str) else None,
                                         "software": p.get("software", {}),
                                         "interpreter": run.get("triton_interpreter", False)})]


def read_pieces(files: tuple[str, ...], trusted_keys: str | None = None, project: str | None = None) -> list[Piece]:
    pieces: list[Piece] = []
    seen: set[Path] = set()
    for f in files:
        paths = sorted(Path(f).glob("*.json")) if Path(f).is_dir() else [Path(f)]
        for path in paths:
            if path.resolve() in seen:
                raise MergeError(f"duplicate: {path} is given twice")
            seen.add(path.resolve())
            if not path.is_file():
                raise MergeError(f"{path}: no such file")
            if path.name.endswith(".intoto.json"):
                pieces += pieces_from_record(str(path), trusted_keys, project)
                continue
            try:
                doc = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise MergeError(f"{path}: not a JSON report ({exc})") from None
            pieces += pieces_from_report(doc, str(path))
    if not pieces:
        raise MergeError("nothing to merge: no report or record in " + ", ".join(files))
    return pieces


# -- merging ---------------------------------------------------------------------------------------
def _location(path: str) -> str:
    return "/".join(Path(path).parts[-2:])


def merge_member(parts: list[tuple[str, MemberResult]], member_message) -> MemberResult:
    spec = parts[0][1].spec
    seen: dict[str, str] = {}
    workloads: list[WorkloadResult] = []
    for origin, m in parts:
        for w in m.workloads:
            if w.workload in seen:
                raise MergeError(f"duplicate: {m.member} {w.workload} is in {seen[w.workload]} and in {origin}; "
                                 "merge each shard's report once")
            seen[w.workload] = origin
            workloads.append(w)
    reasons: dict[str, NotRun] = {}
    for _, m in parts:
        for n in m.coverage.not_run:
            if n.workload in seen:
                continue
            if n.workload not in reasons or reasons[n.workload].kind == "elsewhere":
                reasons[n.workload] = n
    not_run = tuple(NotRun(n.workload, "not run: no merged report holds it (a shard's report is missing)", "skipped")
                    if n.kind == "elsewhere" else n for n in reasons.values())
    checks = parts[0][1].coverage.checks
    cov = Coverage(tuple(w.workload for w in workloads), not_run, checks)
    statuses = {m.status for _, m in parts}
    if "load-error" in statuses:
        first = next(m for _, m in parts if m.status == "load-error")
        return MemberResult(spec, "load-error", first.message, tuple(workloads), cov)
    if not workloads and "skipped" in statuses:
        first = next(m for _, m in parts if m.status == "skipped")
        return MemberResult(spec, "skipped", first.message, (), cov)
    status = member_status(workloads)  # no judged workload in any piece: skipped, never conformant
    return MemberResult(spec, status, member_message(status, workloads, cov), tuple(workloads), cov)


def merge_implementations(pieces: list[Piece]) -> list[ImplementationResult]:
    groups: dict[tuple[str, str], list[Piece]] = {}
    where: dict[tuple[str, str], tuple[str, str]] = {}
    for p in pieces:
        i = p.implementation
        loc = (i.name, _location(i.path))
        if loc in where and where[loc][0] != i.identity:
            raise MergeError(f"conflict: implementation {i.name} ({loc[1]}) has identity {where[loc][0][:16]}… in "
                             f"{where[loc][1]} and {i.identity[:16]}… in {p.origin}: the shards checked different "
                             "trees")
        where.setdefault(loc, (i.identity, p.origin))
        groups.setdefault((i.name, i.identity), []).append(p)
    out = []
    for (_name, _identity), group in groups.items():
        by_member: dict[str, list[tuple[str, MemberResult]]] = {}
        spec_of: dict[str, tuple[str, str]] = {}
        for p in group:
            for m in p.implementation.members:
                if m.member in spec_of and spec_of[m.member][0] != m.spec.identity:
                    raise MergeError(f"conflict: member {m.member} of {p.implementation.name} has spec identity "
                                     f"{spec_of[m.member][0][:16]}… in {spec_of[m.member][1]} and "
                                     f"{m.spec.identity[:16]}… in {p.origin}")
                spec_of.setdefault(m.member, (m.spec.identity, p.origin))
                by_member.setdefault(m.member, []).append((p.origin, m))
        members = [merge_member(parts, member_message) for parts in by_member.values()]
        if sum(1 for p in group if not p.implementation.workloads and p.implementation.status == "skipped"
               and not _stopped(p)) > 1:
            raise MergeError(f"duplicate: {group[0].implementation.name} is reported as skipped by several pieces "
                             f"({', '.join(p.origin for p in group)})")
        first = group[0].implementation
        status = worst_status(m.status for m in members)
        message = members[0].message if len(members) == 1 else "; ".join(f"{m.member}: {m.message}" for m in members)
        worker = dict(first.worker)
        out.append(ImplementationResult(first.name, first.path, first.identity, first.manifest, status, message,
                                        tuple(w for m in members for w in m.workloads), worker, tuple(members)))
    return out


def _stopped(piece: Piece) -> bool:
    """A piece whose work was not started because the run stopped (--fail-fast, --deadline, an
    interrupt): several of those are expected in one slot run, unlike two shards each reporting
    an implementation as skipped."""
    impl = piece.implementation
    # A slot's job holds some members' workloads only: the others are all "elsewhere", never "stopped".
    return not impl.workloads and any(n.kind == "stopped" for m in impl.members for n in m.coverage.not_run)


def run_merge(request: MergeRequest) -> CheckReport:
    pieces = read_pieces(request.files, request.trusted_keys, request.project)
    _check_report_identities(pieces, request.project)
    _check_shards(pieces)
    _check_software(pieces)
    names = {p.device.get("name") or p.device.get("kind") for p in pieces}
    if len(names) > 1:
        raise MergeError(f"conflict: the pieces ran on different devices ({', '.join(sorted(map(str, names)))}); "
                         "merge the shards of one GPU kind at a time")
    impls = merge_implementations(pieces)
    specs = {m.spec.identity: m.spec for i in impls for m in i.members}
    starts = [p.meta.get("started") for p in pieces if p.meta.get("started")]
    ends = [p.meta.get("finished") for p in pieces if p.meta.get("finished")]
    origins = sorted({p.origin for p in pieces})
    first = pieces[0]
    return CheckReport(first.device, bool(first.meta.get("interpreter")), tuple(impls), specs,  # type: ignore[arg-type]
                       min(starts) if starts else "", max(ends) if ends else "", dict(first.meta.get("software", {})),
                       dict(first.meta.get("hardware") or {}), request.strict,
                       (f"merged {len(pieces)} pieces from {len(origins)} files",))


def _check_report_identities(pieces: list[Piece], project: str | None) -> None:
    """A JSON report's implementation identity against this checkout's tree, when the folder is in it."""
    from grpo_conform.evidence.identities import project_root_for, tree_identity  # the evidence stack: see above

    root = project_root_for(None, project)
    if root is None:
        return
    for p in pieces:
        if p.origin.endswith(".intoto.json"):
            continue  # verified in full by verify
        i = p.implementation
        folder = Path(i.path)
        try:
            rel = folder.resolve().relative_to(root).as_posix() if folder.is_absolute() else folder.as_posix()
        except ValueError:
            continue  # run in another checkout: nothing here to recompute from
        here = tree_identity(root, rel)
        if here is not None and here != i.identity:
            raise MergeError(f"conflict: {p.origin} says {i.name} ({rel}) has identity {i.identity[:16]}…, this "
                             f"checkout's tree gives {here[:16]}…: the report was edited or ran another tree")


SOFTWARE_KEYS = ("python", "torch", "triton", "grpo_conform", "cuda_runtime", "git_commit")


def _check_software(pieces: list[Piece]) -> None:
    """One verdict from one software stack: shards run with another torch or commit are not one run."""
    for key in SOFTWARE_KEYS:
        seen: dict[str, str] = {}
        for p in pieces:
            value = (p.meta.get("software") or {}).get(key)
            if value is not None:
                seen.setdefault(str(value), p.origin)
        if len(seen) > 1:
            raise MergeError(f"conflict: the pieces ran with different {key} ("
                             + ", ".join(f"{v} in {o}" for v, o in sorted(seen.items())) + "); merge one run's pieces")


def _check_shards(pieces: list[Piece]) -> None:
    """Shard reports must come whole: every I of one N, each once (records carry no shard: not checked)."""
    shards: dict[str, str] = {}
    for p in pieces:
        s = p.meta.get("shard")
        if not s:
            continue
        if s in shards and shards[s] != p.origin:
            raise MergeError(f"duplicate: shard {s} is in {shards[s]} and in {p.origin}")
        shards.setdefault(s, p.origin)
    if not shards:
        return
    counts = {int(s.split("/")[1]) for s in shards}
    if len(counts) > 1:
        raise MergeError(f"conflict: shards of different splits ({', '.join(sorted(shards))}); merge one split")
    (n,) = counts
    missing = [f"{i}/{n}" for i in range(1, n + 1) if f"{i}/{n}" not in shards]
    if missing:
        raise MergeError(f"shard {', '.join(missing)} missing: merge the reports of all {n} shards (an implementation "
                         "that only a missing shard ran would silently drop out of the verdict)")
