"""What a reported fused-linear number corresponds to when re-run here (issue 31, item 7).

Our own records (evidence/h200/*.intoto.json, verified exactly as `grpo-conform verify` does) of the
fused operation hold timings per protocol: forward, full (and full-scaled), backward-only when it was
asked for. Under each audited row of a known provider (Liger's `liger` -> implementations/fused-liger,
`torch` -> implementations/fused-torch, and folders named after them, e.g. fused-liger-seed), the
reproduction block shows, per implementation, the newest record's median of each protocol on the
same spec member and workload, with the ratio reported / measured. The reported time is of another
GPU (Liger's rows: A100), so a ratio also holds the GPUs' difference; it says which protocol the
reported number is of, never which is faster. No record: the block says "no H200 record" and nothing
else (no number is invented).

Our backward-only protocol is not Liger's in one respect: each timed call gets fresh leaves, so
weight.grad is empty and autograd stores (or copies) the gradient instead of adding to one.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_conform.audit_model import RecordAudit
from grpo_conform.evidence import VerifyRequest, parse_envelope, run_verify
from grpo_conform.evidence.statement import PROJECT_ROOT

DEFAULT_RECORDS = PROJECT_ROOT / "evidence" / "h200"
FUSED_FAMILY = "grpo-fused-linear"
#: a reported row's provider -> the implementation folder that runs the same code here
PROVIDERS = {"liger": "fused-liger", "torch": "fused-torch"}
PROTOCOL_NAMES = {"forward": "forward", "backward": "backward-only", "full": "full"}


@dataclass(frozen=True)
class Measured:
    implementation: str
    protocol: str
    median_ns: int
    path: str
    finished: str
    gpu: str
    signed: bool


@dataclass(frozen=True)
class Reproduction:
    """Our measurements of a reported row's workload, per implementation, or why there are none."""

    reported_ms: float
    reported_protocol: str
    member: str
    workload: Optional[str]
    implementations: tuple[str, ...]
    measured: tuple[Measured, ...]
    gpu_label: str = "H200"

    def to_json(self) -> dict[str, Any]:
        return {"reported_ms": self.reported_ms, "reported_protocol": self.reported_protocol, "member": self.member,
                "workload": self.workload, "implementations": list(self.implementations),
                "measured": [asdict(m) | {"ratio": self.reported_ms * 1e6 / m.median_ns} for m in self.measured]}

    def lines(self) -> list[str]:
        head = f"reproduction ({self.member} {self.workload or '(no spec workload)'}, reported {self.reported_ms:g} " \
               f"ms {PROTOCOL_NAMES.get(self.reported_protocol, self.reported_protocol)}):"
        if not self.measured:
            return [f"{head} no {self.gpu_label} record of {' or '.join(self.implementations) or 'this provider'} "
                    f"for this workload"]
        out = [head]
        for impl in sorted({m.implementation for m in self.measured}):
            mine = [m for m in self.measured if m.implementation == impl]
            first = mine[0]
            parts = [f"{PROTOCOL_NAMES[m.protocol]} {m.median_ns / 1e6:.3g} ms (reported/measured "
                     f"{self.reported_ms * 1e6 / m.median_ns:.2f}x)" for m in mine]
            missing = [PROTOCOL_NAMES[p] for p in PROTOCOL_NAMES if p not in {m.protocol for m in mine}]
            sign = "signed" if first.signed else "UNSIGNED"
            out.append(f"  {impl} on {first.gpu} ({sign}, {first.finished}, {Path(first.path).name}): "
                       + ", ".join(parts) + (f"; not timed: {', '.join(missing)}" if missing else ""))
            same = next((m for m in mine if m.protocol == self.reported_protocol), None)
            if same is not None:
                out.append(f"    the reported number is a {PROTOCOL_NAMES[same.protocol]} time: "
                           f"{self.reported_ms * 1e6 / same.median_ns:.2f}x ours (another GPU: the ratio holds the "
                           "GPUs' difference too" + ("; our backward-only calls get fresh leaves, so weight.grad "
                                                     "starts empty and nothing is added to it)"
                                                     if same.protocol == "backward" else ")"))
        return out


def _candidate(path: Path) -> bool:
    """A cheap look before verifying: does the (unverified) payload name the fused operation's family
    anywhere? A byte search, not a parse: a false hit only costs a verification, and what is verified
    is kept only when its statement's spec is of the family (`load_measurements`). Parsing all of
    them strictly cost ~0.7 s of every audit's ~2 s with the committed records."""
    try:
        envelope = json.loads(path.read_bytes())
        payload = base64.b64decode(envelope["payload"], validate=True)
    except Exception:  # unreadable or another kind of file: verification would reject it anyway
        return False
    return FUSED_FAMILY.encode() in payload


@dataclass(frozen=True)
class Measurements:
    """Timings of the fused operation in our verified records: (implementation, member id, workload) ->
    the newest record's Measured per protocol."""

    folders: tuple[str, ...]
    table: dict[tuple[str, str, str], tuple[Measured, ...]]
    rejected: tuple[str, ...] = ()
    gpu_label: str = "H200"

    def reproduce(self, audit: RecordAudit) -> Optional[Reproduction]:
        provider = audit.record.implementation.strip().lower()
        if audit.spec_id is None or provider not in PROVIDERS:
            return None
        base = PROVIDERS[provider]
        names = sorted({k[0] for k in self.table if k[0] == base or k[0].startswith(base + "-")}) or [base]
        found: list[Measured] = []
        if audit.workload is not None:
            for name in names:
                found += self.table.get((name, audit.spec_id, audit.workload), ())
        return Reproduction(audit.record.median_ms, audit.record.protocol, audit.spec_id, audit.workload,
                            tuple(names), tuple(found), self.gpu_label)


def load_measurements(folders: tuple[str, ...] = (), *, trusted_keys: Optional[str] = None,
                      accept_unsigned: bool = False, project: Optional[str] = None,
                      gpu: str = "h200") -> Measurements:
    """Verified fused-linear records under `folders` (default evidence/h200) of a GPU whose device name
    contains `gpu`. `accept_unsigned` (tests, local trials): unsigned or unverifiable records are read
    too, each shown as UNSIGNED."""
    roots = [Path(f) for f in folders] or [DEFAULT_RECORDS]
    files = sorted(str(f) for root in roots for f in (root.rglob("*.intoto.json") if root.is_dir() else [root])
                   if f.is_file() and _candidate(f))
    label = gpu.upper()
    if not files:
        return Measurements(tuple(map(str, roots)), {}, (), label)
    report = run_verify(VerifyRequest(files=tuple(files), trusted_keys=trusted_keys, allow_unsigned=accept_unsigned,
                                      allow_unverified=accept_unsigned, project=project))
    newest: dict[tuple[str, str, str, str], Measured] = {}
    rejected = []
    for v in report.files:
        if not v.ok and not accept_unsigned:
            rejected.append(v.path)
            continue
        statement = json.loads(parse_envelope(Path(v.path).read_bytes(), expected_type=None).payload)
        p = statement["predicate"]
        if not str(p["spec"]["id"]).startswith(FUSED_FAMILY):  # the cheap look's false hit
            continue
        device = str((p.get("hardware", {}).get("device") or {}).get("name", ""))
        if gpu.lower() not in device.lower():
            continue
        impl, member, finished = p["implementation"]["name"], p["spec"]["id"], p["run"]["finished"]
        for w in p.get("workloads", ()):
            for t in w.get("timings") or ():
                proto = t.get("protocol")
                median = (t.get("event") or {}).get("median_ns", t.get("median_ns"))
                if proto not in PROTOCOL_NAMES or not isinstance(median, int) or median <= 0:
                    continue
                key = (impl, member, w["workload"], proto)
                m = Measured(impl, proto, median, v.path, finished, device, bool(v.ok and not v.unsigned))
                if key not in newest or finished > newest[key].finished:
                    newest[key] = m
    table: dict[tuple[str, str, str], list[Measured]] = {}
    for (impl, member, workload, proto), m in sorted(newest.items()):
        table.setdefault((impl, member, workload), []).append(m)
    order = list(PROTOCOL_NAMES)
    return Measurements(tuple(map(str, roots)),
                        {k: tuple(sorted(v, key=lambda m: order.index(m.protocol))) for k, v in table.items()},
                        tuple(rejected), label)
