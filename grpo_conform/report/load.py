"""Records for the leaderboard: only statements whose envelope passes `verify` (all four steps,
through the evidence package's API) are read; every other file is kept apart with the reason.

The statement shown is the one verification parsed from the payload bytes the signature covers
(`FileVerification.statement`): the file is read once, so the page never shows a byte that the signature did
not cover, and a file rewritten after its verification cannot slip in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_conform.errors import EXIT_USAGE, GrpoConformError
from grpo_conform.evidence import VerifyRequest, run_verify

RECORD_GLOB = "*.intoto.json"  # what a directory contributes (keys, pages and other JSON are not records)


class ReportInputError(GrpoConformError):
    """No record to report on: paths that do not exist or hold no record file."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class VerifiedRecord:
    path: str
    record_identity: str
    statement: dict[str, Any]
    signer: dict[str, str]

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement["predicate"]


@dataclass(frozen=True)
class RejectedRecord:
    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


def record_files(paths: tuple[str, ...]) -> list[str]:
    """Files as given; directories searched recursively for *.intoto.json, in sorted order."""
    found: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found += sorted(str(f) for f in path.rglob(RECORD_GLOB) if f.is_file())
        elif path.is_file():
            found.append(str(path))
        else:
            raise ReportInputError(f"{p}: no such file or directory (give evidence records or folders of "
                                   f"{RECORD_GLOB} files, e.g. evidence/h200)")
    seen: set[str] = set()
    unique = [f for f in found if not (f in seen or seen.add(f))]  # a file named twice is read once
    if not unique:
        raise ReportInputError(f"no evidence record ({RECORD_GLOB}) under {', '.join(paths)}")
    return unique


def _reason(verification: Any) -> str:
    bad = [s for s in verification.steps if not s.ok and s.status != "skipped"]
    return "; ".join(f"{s.step}: {s.message}" for s in bad) or "verification failed"


def _trust_label(report: Any) -> str:
    label = getattr(report, "trust", None) or getattr(report, "trusted_keys", "")
    return str(label)


def load_records(paths: tuple[str, ...], trusted_keys: str | None = None, *, project: str | None = None,
                 now: datetime | None = None) -> tuple[list[VerifiedRecord], list[RejectedRecord], str]:
    """(verified, rejected, what the signatures were checked against). Verification is exactly
    `grpo-conform verify` with its defaults (the shipped trust root unless `trusted_keys` overrides
    it); unsigned or unverifiable records are never accepted here."""
    files = record_files(paths)
    now = now or datetime.now(timezone.utc)
    report = run_verify(VerifyRequest(files=tuple(files), trusted_keys=trusted_keys, project=project, now=now))
    verified: list[VerifiedRecord] = []
    rejected: list[RejectedRecord] = []
    first_path: dict[str, str] = {}  # record identity -> the file it was read from first
    for v in report.files:
        if not v.ok or v.unsigned or not v.record_identity:
            rejected.append(RejectedRecord(v.path, _reason(v) if not v.ok else "not signed"))
            continue
        if v.record_identity in first_path:  # a copy or link of one record counts once (files in sorted order)
            rejected.append(RejectedRecord(v.path, f"the same record as {first_path[v.record_identity]} (record "
                                                   f"identity {v.record_identity[:12]}): counted once"))
            continue
        first_path[v.record_identity] = v.path
        # keyid and owner only: a key file's path would name this machine and make the page differ
        signer = {k: str(v.signers[0][k]) for k in ("keyid", "owner") if k in v.signers[0]} if v.signers else {}
        verified.append(VerifiedRecord(v.path, v.record_identity, v.statement, signer))  # the verified bytes' statement
    return verified, rejected, _trust_label(report)
