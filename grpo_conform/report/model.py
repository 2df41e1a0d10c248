"""The leaderboard as data: one section per (spec member, GPU), each with its implementations
(identity, verdict, signer, date) and one row per implementation x workload x protocol (median,
wall time, floor ratios, rank, "vs #1", peak memory). Everything comes from verified records;
nothing here reads a clock, so the same records always give the same page.

Ranking: per workload and protocol, conformant implementations by median device time; #1 is the
fastest conformant one and "vs #1" is median / #1's median (> 1: slower). A non-conformant
implementation is shown, unranked, with the checks it fails. `backward` is labelled, never ranked
(decision 9: its time depends on what forward already computed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_conform.report.load import VerifiedRecord

PROTOCOL_ORDER = ("full", "full-scaled", "forward", "backward")
UNRANKED = frozenset({"backward"})


@dataclass(frozen=True)
class Implementation:
    name: str
    identity: str
    verdict: str
    result: str
    message: str
    failed_checks: tuple[str, ...]
    language: str
    license: str
    signer: dict[str, str]
    finished: str
    commit: str
    record_path: str
    record_identity: str

    @property
    def conformant(self) -> bool:
        return self.verdict == "conformant"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "identity": {"sha256": self.identity}, "verdict": self.verdict,
                "result": self.result, "message": self.message, "failed_checks": list(self.failed_checks),
                "language": self.language, "license": self.license, "signer": dict(self.signer),
                "finished": self.finished, "commit": self.commit,
                "record": {"path": self.record_path, "identity": {"sha256": self.record_identity}}}


@dataclass(frozen=True)
class Row:
    implementation: str
    workload: str
    batch: int | None
    shape: str
    protocol: str
    conformant: bool
    median_ms: float
    p10_ms: float | None
    p90_ms: float | None
    wall_ms: float | None
    floor_ms: float | None
    floor_model: str
    floor_ratio: float | None  # datasheet bandwidth
    measured_floor_ratio: float | None  # this run's measured ceilings
    peak_bytes: int | None
    peak_over_logits: float | None
    rank: int | None = None
    vs_first: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Section:
    spec_id: str
    spec_version: str
    spec_identity: str
    member: str | None
    gpu: str
    device_name: str
    ceilings: dict[str, float]
    implementations: tuple[Implementation, ...]
    rows: tuple[Row, ...] = field(default_factory=tuple)

    @property
    def key(self) -> str:
        return f"{self.spec_id}@{self.spec_identity[:12]} on {self.gpu}"

    @property
    def protocols(self) -> list[str]:
        seen = {r.protocol for r in self.rows}
        return [p for p in PROTOCOL_ORDER if p in seen] + sorted(seen - set(PROTOCOL_ORDER))

    def to_json(self) -> dict[str, Any]:
        return {"spec": {"id": self.spec_id, "version": self.spec_version, "identity": {"sha256": self.spec_identity},
                         "member": self.member},
                "gpu": self.gpu, "device_name": self.device_name, "ceilings": dict(self.ceilings),
                "protocols": self.protocols, "implementations": [i.to_json() for i in self.implementations],
                "results": [r.to_json() for r in self.rows]}


def _ms(ns: Any) -> float | None:
    return round(ns / 1e6, 6) if isinstance(ns, (int, float)) else None


def _num(v: Any) -> float | None:
    return round(float(v), 6) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _gpu(pred: dict[str, Any]) -> tuple[str, str]:
    hw = pred.get("hardware") or {}
    device = (hw.get("device") or {})
    name = (hw.get("catalogue") or {}).get("name") or hw.get("device_name") or device.get("name")
    if not name:  # a CPU run
        name = "CPU" + (f" ({device['name']})" if device.get("name") else "")
    return str(name), str(hw.get("device_name") or device.get("name") or name)


def _implementation(rec: VerifiedRecord) -> Implementation:
    p = rec.predicate
    impl = p.get("implementation") or {}
    failed = sorted({t.split("/")[-1] for t in p.get("failedTests", [])})
    return Implementation(impl.get("name", "?"), impl.get("identity", ""), p.get("verdict", "?"),
                          p.get("result", "?"), p.get("message", ""), tuple(failed), impl.get("language") or "",
                          impl.get("license") or "", rec.signer, (p.get("run") or {}).get("finished", ""),
                          (p.get("software") or {}).get("git_commit") or "", rec.path, rec.record_identity)


def _rows(rec: VerifiedRecord, impl: Implementation) -> list[Row]:
    rows = []
    for w in rec.predicate.get("workloads", []):
        axes = w.get("axes") or {}
        dtype = (w.get("dtypes") or {}).get("logits", "")
        shape = " x ".join(f"{k} {axes[k]}" for k in ("batch", "seq", "vocab") if k in axes) + (f", {dtype}" if dtype
                                                                                               else "")
        for t in w.get("timings", []):
            event = t.get("event") or {}
            if not isinstance(event.get("median_ns"), (int, float)):
                continue
            floor = t.get("floor") or {}
            floor_ns = floor.get("measured_ns") or floor.get("floor_ns")
            rows.append(Row(impl.name, w.get("workload", "?"), axes.get("batch"), shape, t.get("protocol", "?"),
                            impl.conformant, _ms(event["median_ns"]), _ms(event.get("p10_ns")),
                            _ms(event.get("p90_ns")), _ms((t.get("host_wall") or {}).get("median_ns")),
                            _ms(floor_ns), str(floor.get("method") or floor.get("model") or ""),
                            _num(t.get("floor_ratio")), _num(t.get("measured_floor_ratio")),
                            t.get("peak_bytes") if isinstance(t.get("peak_bytes"), int) else None,
                            _num(t.get("peak_over_logits"))))
    return rows


def _ranked(rows: list[Row]) -> list[Row]:
    out = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.workload, r.protocol), []).append(r)
    for (_w, protocol), group in groups.items():
        honest = sorted((r for r in group if r.conformant), key=lambda r: (r.median_ms, r.implementation))
        others = sorted((r for r in group if not r.conformant), key=lambda r: (r.median_ms, r.implementation))
        first = honest[0].median_ms if honest and protocol not in UNRANKED else None
        for i, r in enumerate(honest + others):
            rank = i + 1 if r.conformant and protocol not in UNRANKED else None
            vs = round(r.median_ms / first, 6) if first else None
            out.append(Row(**{**r.__dict__, "rank": rank, "vs_first": vs}))
    order = {p: i for i, p in enumerate(PROTOCOL_ORDER)}
    out.sort(key=lambda r: (order.get(r.protocol, 99), r.protocol, r.batch or 0, r.workload,
                            r.rank or 10_000, r.median_ms))
    return out


def build_sections(records: list[VerifiedRecord]) -> list[Section]:
    """Group by (spec id, spec identity, GPU); the newest record of an implementation wins in a group
    (older ones are still listed in the JSON's inputs)."""
    groups: dict[tuple[str, str, str], list[VerifiedRecord]] = {}
    for rec in records:
        spec = rec.predicate.get("spec") or {}
        gpu, _ = _gpu(rec.predicate)
        groups.setdefault((str(spec.get("id", "?")), str(spec.get("identity", "")), gpu), []).append(rec)
    sections = []
    for (spec_id, identity, gpu), recs in sorted(groups.items()):
        newest: dict[str, VerifiedRecord] = {}
        for rec in sorted(recs, key=lambda r: ((r.predicate.get("run") or {}).get("finished", ""), r.path)):
            newest[(rec.predicate.get("implementation") or {}).get("name", "?")] = rec
        impls, rows = [], []
        for name in sorted(newest):
            impl = _implementation(newest[name])
            impls.append(impl)
            rows += _rows(newest[name], impl)
        first = recs[0].predicate
        spec = first.get("spec") or {}
        ceilings = (first.get("hardware") or {}).get("ceilings") or {}
        measured = {k: round(float(ceilings[k]) / 1e12, 4) for k in ("read_bytes_per_s", "copy_bytes_per_s")
                    if isinstance(ceilings.get(k), (int, float))}
        sections.append(Section(spec_id, str(spec.get("version", "")), identity, spec.get("member"), gpu,
                                _gpu(first)[1], {k.replace("_bytes_per_s", "_tb_per_s"): v for k, v in measured.items()},
                                tuple(impls), tuple(_ranked(rows))))
    return sections
