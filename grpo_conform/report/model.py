"""The leaderboard as data: one section per (spec member, GPU) at the member's current identity,
the member's superseded identities folded under it as history; each with its implementations
(folder path and identity, verdict, signer, date) and one row per implementation x workload x
protocol (median, wall time, floor ratios, rank, "vs #1", peak memory). Which record fills which
cell: `select.py`. Everything comes from verified records and the checkout; nothing here reads a
clock, so the same records and tree always give the same page.

Ranking: per workload and protocol, conformant implementations by median device time; #1 is the
fastest conformant one and "vs #1" is median / #1's median (> 1: slower). A non-conformant
implementation is shown, unranked, with the checks it fails. `backward` is labelled, never ranked
(decision backward-unranked, docs/decisions.md: its time depends on what forward already computed). A cell is ranked only when its
record is conformant, its checks were not narrowed, and its time is not below the record's own
datasheet floor (impossible: shown, flagged, never ranked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pathlib import Path

from grpo_conform.evidence import gpu_named
from grpo_conform.evidence.partial import checks_narrowed, partial_reason
from grpo_conform.report import select
from grpo_conform.report.load import VerifiedRecord

PROTOCOL_ORDER = ("full", "full-scaled", "forward", "backward")
NOT_IN_TREE = "identity not in this checkout's tree (the folder changed or is absent): no cell"
UNRANKED = frozenset({"backward"})
#: what a section's GPU title ends with when the catalogue does not know the GPU: no floor checked its times
UNKNOWN_GPU = " (not in the GPU catalogue: unranked)"


@dataclass(frozen=True)
class Implementation:
    name: str  # the manifest's name, as the record says
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
    path: str = ""  # the folder: with the identity, what keys an implementation
    label: str = ""  # how rows name it: the name, or "name (path)" when two folders claim the name
    flags: tuple[str, ...] = ()  # name claimed by several folders, identity not in the tree, partial record
    records: int = 1  # records of this identity that fill cells or were read

    @property
    def conformant(self) -> bool:
        return self.verdict == "conformant"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "identity": {"sha256": self.identity}, "verdict": self.verdict,
                "result": self.result, "message": self.message, "failed_checks": list(self.failed_checks),
                "language": self.language, "license": self.license, "signer": dict(self.signer),
                "finished": self.finished, "commit": self.commit,
                "record": {"path": self.record_path, "identity": {"sha256": self.record_identity}},
                "path": self.path, "label": self.label or self.name, "flags": list(self.flags), "records": self.records}


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
    record_identity: str = ""  # the record this cell was read from
    flag: str = ""  # why a conformant implementation's cell is not ranked ("impossible: ...", "checks narrowed")
    partial: str = ""  # the cell's record covers less than the member (partial_reason): ranked on this workload only
    floor_binding: str = ""  # which of the record's floors binds (dram | measured | arithmetic): floor.binding
    binding_floor_ratio: float | None = None  # median / the binding floor (max of DRAM, measured, FLOP/exp floors)
    gemm_ceiling_ratio: float | None = None  # median / this run's cuBLAS time of the same GEMMs, when recorded
    gemm_ceiling_layout: str = ""  # the ceiling's layout per GEMM ("2048 / 2048 / whole"); "" before layouts were timed

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
    current: bool = True  # the identity the checkout's spec resolves to (or the newest, when it has none)
    history: tuple["Section", ...] = ()  # superseded identities of the same member and GPU, newest first
    resolved: bool = True  # whether the checkout resolved this member (else: titled by the record's spec id)
    operation: str = "grpo-logits"  # the spec's operation: grpo-fused-linear sections show their own columns

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
                "results": [r.to_json() for r in self.rows], "current": self.current, "resolved": self.resolved,
                "operation": self.operation,
                "history": [h.to_json() for h in self.history]}


def _ms(ns: Any) -> float | None:
    return round(ns / 1e6, 6) if isinstance(ns, (int, float)) else None


def _num(v: Any) -> float | None:
    return round(float(v), 6) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _gpu(pred: dict[str, Any]) -> tuple[str, str]:
    """The section's GPU and the device's own name. A timed record's GPU is the catalogue entry its names
    resolve to (gpu_named.py, as `verify` judged its floor), so no spelling of a name opens a section of its
    own; one the catalogue does not know is titled as such, and its rows are never ranked (`_row`)."""
    hw = pred.get("hardware") or {}
    device = (hw.get("device") or {})
    name = (hw.get("catalogue") or {}).get("name") or hw.get("device_name") or device.get("name")
    if device.get("kind") == "cpu" or not name:  # a CPU run
        name = "CPU" + (f" ({device['name']})" if device.get("name") else "")
    elif any(w.get("timings") for w in pred.get("workloads") or []):
        named = gpu_named.resolve(hw)
        name = named.gpu.name if named.gpu is not None else f"{name}{UNKNOWN_GPU}"
    return str(name), str(hw.get("device_name") or device.get("name") or name)


def _implementation(chosen: select.Chosen, label: str, flags: tuple[str, ...], current: bool) -> Implementation:
    rec = chosen.records[0]  # the newest record of the identity that counts
    p = rec.predicate
    impl = p.get("implementation") or {}
    failed = sorted({t.split("/")[-1] for r in chosen.records for t in r.predicate.get("failedTests", [])})
    verdicts = {r.predicate.get("verdict", "?") for r in chosen.records}
    verdict = next((v for v in ("load-error", "failed", "skipped") if v in verdicts), p.get("verdict", "?"))
    result = "FAILED" if failed or verdict != "conformant" else p.get("result", "?")
    partial = [why for r in chosen.records if (why := partial_reason(r.predicate))]
    if partial and len(partial) == len(chosen.records):
        flags += (f"partial records ({partial[0]})",)
    if not chosen.in_tree and current:
        flags += (NOT_IN_TREE,)
    return Implementation(str(impl.get("name", "?")), chosen.identity, verdict, result, p.get("message", ""),
                          tuple(failed), impl.get("language") or "", impl.get("license") or "", rec.signer,
                          select.finished(rec), (p.get("software") or {}).get("git_commit") or "", rec.path,
                          rec.record_identity, chosen.path, label, flags, len(chosen.records))


def _impossible(t: dict[str, Any]) -> str:
    """Why a timing cannot be real: below the datasheet DRAM floor its own record states."""
    floor = t.get("floor") or {}
    median = (t.get("event") or {}).get("median_ns")
    floor_ns = floor.get("floor_ns")
    if t.get("below_floor") is True or (isinstance(floor_ns, (int, float)) and floor_ns > 0
                                         and isinstance(median, (int, float)) and median < floor_ns):
        return "impossible: below the DRAM floor of its own record, never ranked"
    return ""


def _row(rec: VerifiedRecord, impl: Implementation, w: dict[str, Any], t: dict[str, Any], gpu: str) -> Row:
    axes = w.get("axes") or {}
    dtypes = w.get("dtypes") or {}
    dtype = dtypes.get("logits") or dtypes.get("hidden", "")  # grpo-fused-linear: the GEMM operands' dtype
    shape = " x ".join(f"{k} {axes[k]}" for k in ("batch", "seq", "hidden", "vocab") if k in axes) + (f", {dtype}" if dtype
                                                                                           else "")
    event, floor = t.get("event") or {}, t.get("floor") or {}
    floor_ns = floor.get("measured_ns") or floor.get("floor_ns")
    conformant = rec.predicate.get("verdict") == "conformant"
    flag = _impossible(t) or ((f"not ranked: {checks_narrowed(rec.predicate)}" if checks_narrowed(rec.predicate)
                               else "") if conformant else "")
    if not flag and conformant and gpu.endswith(UNKNOWN_GPU):  # the section's GPU, as _gpu resolved it
        flag = "not ranked: a GPU the catalogue does not know, so no floor checked this time"
    if not flag and conformant and t.get("protocol") not in PROTOCOL_ORDER:  # verify refuses these too
        flag = f"not ranked: {str(t.get('protocol'))[:40]!r} is not a timed protocol"
    binding = floor.get("floor_ns")
    binding_ratio = event["median_ns"] / binding if isinstance(binding, (int, float)) and binding > 0 else None
    return Row(impl.label, str(w.get("workload", "?")), axes.get("batch"), shape, str(t.get("protocol", "?")),
               conformant and not flag, _ms(event["median_ns"]), _ms(event.get("p10_ns")), _ms(event.get("p90_ns")),
               _ms((t.get("host_wall") or {}).get("median_ns")), _ms(floor_ns),
               str(floor.get("method") or floor.get("model") or ""), _num(t.get("floor_ratio")),
               _num(t.get("measured_floor_ratio")), t.get("peak_bytes") if isinstance(t.get("peak_bytes"), int) else None,
               _num(t.get("peak_over_logits")), record_identity=rec.record_identity, flag=flag,
               partial=partial_reason(rec.predicate) or "", floor_binding=str(floor.get("binding") or ""),
               binding_floor_ratio=_num(binding_ratio), gemm_ceiling_ratio=_num(t.get("gemm_ceiling_ratio")),
               gemm_ceiling_layout=_layout(t["gemm_ceiling"].get("layout") if isinstance(t.get("gemm_ceiling"), dict)
                                           else None))


def _layout(names: Any) -> str:
    """The ceiling's layout per GEMM, short ("2048 / 2048 / whole"); "" for records before layouts were timed."""
    if not isinstance(names, list) or not names:
        return ""
    return " / ".join(str(n).replace("rows of ", "")[:12] for n in names[:6])


def _rows(chosen: select.Chosen, impl: Implementation, gpu: str) -> list[Row]:
    rows = []
    for (workload, protocol), rec in select.cells(chosen).items():
        w = next(w for w in rec.predicate.get("workloads", []) if w.get("workload") == workload)
        rows.append(_row(rec, impl, w, select.timed(rec, workload, protocol), gpu))  # type: ignore[arg-type]
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
                            r.rank or 10_000, r.median_ms, r.implementation))
    return out


def _section(member: select.MemberName, identity: str, gpu: str, recs: list[VerifiedRecord], root: Path | None,
             current: bool) -> Section:
    chosen = select.choose(recs, root)
    paths_of: dict[str, set[str]] = {}
    for c in chosen:
        paths_of.setdefault(select.impl_name(c.records[0]), set()).add(c.path)
    impls, rows = [], []
    for c in chosen:
        name = select.impl_name(c.records[0])
        shared = len(paths_of[name]) > 1
        flags = (f"the name {name!r} is claimed by {len(paths_of[name])} folders: "
                 f"{', '.join(sorted(paths_of[name]))}",) if shared else ()
        impl = _implementation(c, f"{name} ({c.path})" if shared else name, flags, current)
        impls.append(impl)
        if c.in_tree or not current:  # the current table shows only what the checkout's tree holds
            rows += _rows(c, impl, gpu)
    newest = max(recs, key=lambda r: (select.finished(r), r.path)) if recs else None
    pred = newest.predicate if newest is not None else {}
    spec = pred.get("spec") or {}
    ceilings = (pred.get("hardware") or {}).get("ceilings") or {}
    measured = {k.replace("_bytes_per_s", "_tb_per_s"): round(float(ceilings[k]) / 1e12, 4)
                for k in ("read_bytes_per_s", "copy_bytes_per_s") if isinstance(ceilings.get(k), (int, float))}
    title = member.label if current else str(spec.get("id", member.label))  # history keeps its own id
    return Section(title, str(spec.get("version", member.version)), identity, spec.get("member"), gpu,
                   _gpu(pred)[1] if pred else gpu, measured, tuple(impls), tuple(_ranked(rows)), current,
                   resolved=member.current_identity is not None, operation=member.operation)


def build_sections(records: list[VerifiedRecord], project: str | None = None) -> list[Section]:
    """One section per (spec member, GPU) at the member's current identity, its other identities as
    history. `project`: the checkout that names members and implementation identities (default: the
    current directory's)."""
    root = select.project_root(project)
    groups: dict[tuple[str, str], tuple[select.MemberName, list[VerifiedRecord]]] = {}
    for rec in records:
        member = select.member_of(rec, root)
        gpu, _ = _gpu(rec.predicate)
        groups.setdefault((member.label, gpu), (member, []))[1].append(rec)
    sections = []
    for (_label, gpu), (member, recs) in sorted(groups.items()):
        by_identity: dict[str, list[VerifiedRecord]] = {}
        for rec in recs:
            by_identity.setdefault(str((rec.predicate.get("spec") or {}).get("identity", "")), []).append(rec)
        newest_first = sorted(by_identity, key=lambda i: max(select.finished(r) for r in by_identity[i]),
                              reverse=True)
        current = member.current_identity or newest_first[0]
        history = tuple(_section(member, i, gpu, by_identity[i], root, False) for i in newest_first if i != current)
        top = _section(member, current, gpu, by_identity.get(current, []), root, True)
        sections.append(Section(**{**top.__dict__, "history": history}))
    return sections
