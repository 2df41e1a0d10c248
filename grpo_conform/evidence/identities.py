"""The `identities` step of verify: what a record claims, against itself and against this tree.

The record identity (sha256 of the payload bytes) is reported. The spec identity is recomputed
when this tree has a spec with the recorded id and version (or the file the configuration uri
names); the implementation identity when the folder exists at the recorded path, relative to the
current directory or the project root. Absent files are notes; differences are failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpo_conform.canonical import sha256_hex
from grpo_conform.evidence.statement import PROJECT_ROOT
from grpo_conform.implementations import ManifestError, folder_listing
from grpo_conform.spec import SpecError, find_spec, load_spec


@dataclass(frozen=True)
class IdentityCheck:
    kind: Literal["record", "spec", "implementation"]
    name: str
    recorded: str
    recomputed: str | None  # None: this tree lacks what it would be recomputed from
    source: str | None = None

    @property
    def status(self) -> str:
        if self.recomputed is None:
            return "not-recomputed"
        return "match" if self.recomputed == self.recorded else "differs"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "recorded": self.recorded, "recomputed": self.recomputed,
                "source": self.source, "status": self.status}


@dataclass(frozen=True)
class IdentityFindings:
    problems: tuple[str, ...]  # any problem fails the step
    notes: tuple[str, ...]
    checks: tuple[IdentityCheck, ...]


def _short(hexdigest: str) -> str:
    return hexdigest[:16] + "…"


def check_identities(statement: dict[str, Any], record_identity: str) -> IdentityFindings:
    """`statement` has passed the schema, so the fields read here exist."""
    predicate = statement["predicate"]
    spec, impl = predicate["spec"], predicate["implementation"]
    problems: list[str] = []
    notes = [f"record identity sha256 {record_identity}"]

    # The statement must agree with itself: subject, implementation and configuration name one folder.
    subject = statement["subject"][0]["digest"]["sha256"]
    if subject != impl["identity"]:
        problems.append(f"subject digest {_short(subject)} differs from predicate.implementation.identity "
                        f"{_short(impl['identity'])}")
    descriptors = {d["name"].split(":", 1)[0]: d for d in predicate["configuration"]}
    for kind, recorded in (("spec", spec["identity"]), ("implementation", impl["identity"])):
        d = descriptors.get(kind)
        if d is None:
            problems.append(f"configuration has no '{kind}:...' resource descriptor")
        elif d["digest"]["sha256"] != recorded:
            problems.append(f"configuration {d['name']} digest {_short(d['digest']['sha256'])} differs from "
                            f"predicate.{kind}.identity {_short(recorded)}")

    checks = [IdentityCheck("record", "payload", record_identity, record_identity, "sha256 of the payload bytes")]
    spec_uri = descriptors.get("spec", {}).get("uri")
    checks.append(_spec_identity(spec, spec_uri))
    checks.append(_implementation_identity(impl))
    for c in checks[1:]:
        if c.status == "differs":
            problems.append(f"{c.kind} {c.name}: recorded sha256 {c.recorded}, this tree has {c.recomputed} "
                            f"({c.source})")
        elif c.status == "match":
            notes.append(f"{c.kind} {c.name}: matches {c.source}")
        else:
            notes.append(f"{c.kind} {c.name}: not recomputed ({c.source})")
    return IdentityFindings(tuple(problems), tuple(notes), tuple(checks))


def _candidates(relative: str) -> list[Path]:
    if Path(relative).is_absolute():
        return [Path(relative)]
    out: list[Path] = []
    for base in (Path.cwd(), PROJECT_ROOT):
        p = (base / relative).resolve()
        if p not in out:
            out.append(p)
    return out


def _spec_identity(spec: dict[str, Any], uri: str | None) -> IdentityCheck:
    name = f"{spec['id']}@{spec['version']}"
    try:
        found = find_spec(name)
        return IdentityCheck("spec", name, spec["identity"], found.identity, found.source)
    except SpecError as exc:
        reason = exc.problem
    for p in _candidates(uri) if uri else []:
        if p.is_file():
            try:
                loaded = load_spec(p)
            except SpecError as exc:
                return IdentityCheck("spec", name, spec["identity"], f"unreadable: {exc.problem}", str(p))
            return IdentityCheck("spec", name, spec["identity"], loaded.identity, str(p))
    return IdentityCheck("spec", name, spec["identity"], None, f"no spec {name} here: {reason}")


def _implementation_identity(impl: dict[str, Any]) -> IdentityCheck:
    name = impl["path"]
    for p in _candidates(name):
        if p.is_dir():
            try:
                recomputed = sha256_hex(folder_listing(p).encode())
            except (ManifestError, OSError) as exc:
                recomputed = f"unreadable: {exc}"
            return IdentityCheck("implementation", name, impl["identity"], recomputed, f"folder {p}")
    return IdentityCheck("implementation", name, impl["identity"], None,
                         f"no folder {name} under {' or '.join(str(b) for b in (Path.cwd(), PROJECT_ROOT))}")
