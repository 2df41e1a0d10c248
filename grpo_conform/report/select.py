"""Which records fill the leaderboard (issue 29), as plain functions of the records and the checkout:

- a spec member is named by what the verifier's checkout resolves the record's spec id to (the
  standalone `grpo-token-is` file and the family member `grpo/token-is` are one member); its
  current identity is the resolved one, every other identity is history;
- an implementation is its folder path and identity, never its manifest name: two folders that
  claim one name are two implementations, flagged;
- per implementation the identity that counts is the one in the checkout's tree (else, when the
  tree has none of its records' identities, the newest record's, flagged), and per workload and
  protocol the cell comes from the newest record of that identity that timed it: a newer record
  without timings (a long-completion run) never hides older timed ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo_conform.evidence.identities import project_root_for, tree_identity
from grpo_conform.ops import operation_name
from grpo_conform.report.load import VerifiedRecord
from grpo_conform.spec import find_spec


@dataclass(frozen=True)
class MemberName:
    label: str  # what the section is titled: "grpo/token-is", or the record's spec id when unresolved
    version: str
    current_identity: str | None  # None: the checkout does not have this spec
    operation: str = "grpo-logits"  # the spec's operation (grpo_conform/ops): which columns its section shows


#: an unresolved spec id (the checkout lacks it) is taken to be of the operation its family prefix names
FUSED_PREFIX = "grpo-fused-linear"


def finished(rec: VerifiedRecord) -> str:
    return str((rec.predicate.get("run") or {}).get("finished", ""))


@lru_cache(maxsize=256)
def _resolve(spec_id: str, specs_dir: str) -> MemberName | None:
    try:
        spec = find_spec(spec_id, dirs=[Path(specs_dir)])
    except Exception:  # noqa: BLE001 - a spec the checkout lacks is shown under its own id, not an error
        return None
    return MemberName(spec.id, spec.version, spec.identity, operation_name(spec))


def member_of(rec: VerifiedRecord, root: Path | None) -> MemberName:
    spec = rec.predicate.get("spec") or {}
    spec_id = str(spec.get("id", "?"))
    resolved = _resolve(spec_id, str(root / "specs")) if root is not None else None
    operation = FUSED_PREFIX if spec_id.split("/")[0] == FUSED_PREFIX else "grpo-logits"
    return resolved or MemberName(spec_id, str(spec.get("version", "")), None, operation)


def project_root(project: str | None) -> Path | None:
    return project_root_for(None, project)


def impl_key(rec: VerifiedRecord) -> str:
    impl = rec.predicate.get("implementation") or {}
    return str(impl.get("path") or impl.get("name") or "?")


def impl_name(rec: VerifiedRecord) -> str:
    return str((rec.predicate.get("implementation") or {}).get("name", "?"))


def impl_identity(rec: VerifiedRecord) -> str:
    return str((rec.predicate.get("implementation") or {}).get("identity", ""))


@dataclass(frozen=True)
class Chosen:
    path: str
    identity: str
    in_tree: bool
    records: tuple[VerifiedRecord, ...]  # of that identity, newest first


def choose(records: list[VerifiedRecord], root: Path | None) -> list[Chosen]:
    """Per implementation folder, the identity that counts and its records, newest first."""
    by_path: dict[str, list[VerifiedRecord]] = {}
    for rec in records:
        by_path.setdefault(impl_key(rec), []).append(rec)
    out = []
    for path, recs in sorted(by_path.items()):
        recs.sort(key=lambda r: (finished(r), r.path), reverse=True)
        here = tree_identity(root, path)
        identity = here if here is not None and any(impl_identity(r) == here for r in recs) else impl_identity(recs[0])
        out.append(Chosen(path, identity, identity == here, tuple(r for r in recs if impl_identity(r) == identity)))
    return out


def timed(rec: VerifiedRecord, workload: str, protocol: str) -> dict[str, Any] | None:
    """The record's timing of `workload` under `protocol` when it has a median, else None."""
    for w in rec.predicate.get("workloads", []):
        if w.get("workload") != workload:
            continue
        for t in w.get("timings", []):
            if t.get("protocol") == protocol and isinstance((t.get("event") or {}).get("median_ns"), (int, float)):
                return t
    return None


def cells(chosen: Chosen) -> dict[tuple[str, str], VerifiedRecord]:
    """(workload, protocol) -> the newest record of the chosen identity that timed it."""
    out: dict[tuple[str, str], VerifiedRecord] = {}
    for rec in chosen.records:  # newest first: the first to time a cell keeps it
        for w in rec.predicate.get("workloads", []):
            for t in w.get("timings", []):
                key = (str(w.get("workload", "?")), str(t.get("protocol", "?")))
                if key not in out and timed(rec, *key) is not None:
                    out[key] = rec
    return out
