"""`grpo-conform report EVIDENCE...`: the request and the leaderboard object (write.py renders it).

The page is a pure function of the records (and reported files) given: no clock, no host name, no
absolute path is read, so rebuilding from the same inputs gives byte-identical files (a test checks
the committed page, evidence/leaderboard/, against a rebuild).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo_conform.evidence.identities import project_root_for, tree_identity
from grpo_conform.report.load import RejectedRecord, VerifiedRecord, load_records
from grpo_conform.report.model import Section, build_sections
from grpo_conform.report.reported import MEANINGS, ReportedRow, audit_reported
from grpo_conform.report.sweep import Sweep, load_sweeps

FORMAT = "grpo-conform-leaderboard/1"
SWEPT = "implementations/triton"  # the folder benchmarks/sweep_logits.py times
#: the shape sweeps of implementations/triton shown on the committed page (issue 36), oldest first
SWEEPS = ("benchmarks/results/h200-2026-12-03d/round20c/reports/sweep.json",
          "benchmarks/results/h200-2026-12-03e/round22/r/sweep.json",
          "benchmarks/results/h200-2026-12-03f/round26e/reports/sweep.json",
          "benchmarks/results/h100-2026-12-06e/sweep36-69f694d/sweep.json",
          "benchmarks/results/h100-2026-12-07c/s43-44ceb16/sweep.json")
REGENERATE = ("grpo-conform report evidence/h200 evidence/h100 --reported tests/data/seed-records.csv "
              "--against tests/data/liger-fused-linear-grpo.csv " + " ".join(f"--sweep {p}" for p in SWEEPS)
              + " --out evidence/leaderboard")


@dataclass(frozen=True)
class ReportRequest:
    paths: tuple[str, ...]
    reported: tuple[str, ...] = ()
    out: str | None = "leaderboard"  # None: write nothing (the caller renders what it needs)
    trusted_keys: str | None = None
    spec: str = "grpo-token-is"  # what reported logits-level records are audited against
    against: str | None = None  # Liger's own benchmark CSV: which of its rows a reported number is (audit --against)
    formats: tuple[str, ...] = ("html", "markdown", "json")
    project: str | None = None  # the checkout that resolves members and implementation identities (default: cwd's)
    now: datetime | None = None  # the verification time (tests); default: the clock
    sweeps: tuple[str, ...] = ()  # benchmarks/sweep_logits.py JSON files: the page's shape-sweep sections, one per GPU


@dataclass(frozen=True)
class Leaderboard:
    sections: tuple[Section, ...]
    reported: tuple[ReportedRow, ...]
    rejected: tuple[RejectedRecord, ...]
    inputs: tuple[VerifiedRecord, ...]
    trusted_keys: str
    audited_against: str  # the specs the reported rows were judged against, comma-separated (each row names its own)
    written: tuple[str, ...] = field(default_factory=tuple)
    sweeps: tuple[Sweep, ...] = ()  # unsigned benchmark output, shown apart from the records: one per GPU

    @property
    def latest(self) -> str:
        """The newest run.finished among the verified records: the page's only date."""
        return max(((r.predicate.get("run") or {}).get("finished", "") for r in self.inputs), default="")

    def to_json(self) -> dict[str, Any]:
        # "sweep": the first GPU's, as format v1 had it before sweeps were kept apart by GPU; "sweeps": every GPU's
        extra = {"sweep": self.sweeps[0].to_json(), "sweeps": [s.to_json() for s in self.sweeps]} if self.sweeps else {}
        return {
            **extra,
            "format": FORMAT,
            "latest_run": self.latest,
            "trusted_keys": self.trusted_keys,
            "regenerate": REGENERATE,
            "records": [{"path": r.path, "identity": {"sha256": r.record_identity}, "signer": dict(r.signer)}
                        for r in self.inputs],
            "rejected": [r.to_json() for r in self.rejected],
            "sections": [s.to_json() for s in self.sections],
            "reported": {"audited_against": self.audited_against, "meanings": dict(MEANINGS),
                         "records": [r.to_json() for r in self.reported]},
        }


def build_leaderboard(request: ReportRequest) -> Leaderboard:
    verified, rejected, keys_file = load_records(request.paths, request.trusted_keys, project=request.project,
                                                 now=request.now)
    reported = audit_reported(request.reported, request.spec, request.against) if request.reported else []
    against = ", ".join(dict.fromkeys(r.audited_against for r in reported)) or request.spec
    sweeps: tuple[Sweep, ...] = ()
    if request.sweeps:
        root = project_root_for(None, request.project)
        sweeps = load_sweeps(request.sweeps, tree_identity(root, SWEPT))
    return Leaderboard(tuple(build_sections(verified, request.project)), tuple(reported), tuple(rejected), tuple(verified),
                       _display_path(keys_file), against, sweeps=sweeps)


def _display_path(path: str) -> str:
    """Relative to the working directory when inside it (the page must not name this machine's paths)."""
    p = Path(path)
    if not p.exists():  # a description ("shipped trust root: ..."), not a file
        return path
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return p.name
