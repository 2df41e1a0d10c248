"""The leaderboard's tables as plain cells, shared by the HTML and Markdown renderers."""

from __future__ import annotations

from grpo_conform.report.model import Implementation, Row, Section
from grpo_conform.report.reported import ReportedRow

TIMING_HEADERS = ("workload", "#", "implementation", "median ms (p10-p90)", "wall ms", "x floor", "vs #1",
                  "peak memory", "conformance")
IMPL_HEADERS = ("implementation", "folder", "verdict", "identity (sha256)", "language", "license", "signed by", "run finished",
                "commit", "record (sha256)")
REPORTED_HEADERS = ("implementation", "GPU", "workload", "protocol", "median ms", "x floor", "audit",
                    "audited against", "why", "source")

PROTOCOL_TITLES = {
    "full": "full: forward + backward with upstream gradient 1 (the headline)",
    "full-scaled": "full-scaled: forward + (c * loss).backward(), c = the spec's upstream scale (what trainers run)",
    "forward": "forward: the loss alone",
    "backward": "backward: labelled, never ranked (its time depends on what forward already did)",
}


def short(hexdigest: str, n: int = 12) -> str:
    return hexdigest[:n] + "…" if len(hexdigest) > n else hexdigest


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "—"


def _ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.4f}" if v < 10 else f"{v:.2f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def conformance(impl: Implementation | None) -> str:
    if impl is None:
        return "?"
    if impl.conformant:
        return "conformant" + "".join(f"; {f}" for f in impl.flags)
    text = f"fails {', '.join(impl.failed_checks)}" if impl.failed_checks else impl.verdict
    return text + "".join(f"; {f}" for f in impl.flags)


def _row_conformance(impl: Implementation | None, row: Row) -> str:
    if row.flag:
        return row.flag
    text = "conformant" if impl is not None and row.conformant else conformance(impl).split("; ")[0]
    return text + (f" (partial record: {row.partial})" if row.partial else "")


def timing_rows(section: Section, protocol: str) -> list[tuple[str, ...]]:
    impls = {i.label or i.name: i for i in section.implementations}
    out = []
    last = None
    for r in (r for r in section.rows if r.protocol == protocol):
        label = f"{r.workload} (batch {r.batch})" if r.batch is not None else r.workload
        spread = f" ({_ms(r.p10_ms)}-{_ms(r.p90_ms)})" if r.p10_ms is not None and r.p90_ms is not None else ""
        floor = _x(r.measured_floor_ratio if r.measured_floor_ratio is not None else r.floor_ratio)
        if r.floor_ratio is not None and r.measured_floor_ratio is not None:
            floor += f" (datasheet {r.floor_ratio:.2f}x)"
        peak = _bytes(r.peak_bytes) + (f" ({r.peak_over_logits:.2f}x logits)" if r.peak_over_logits is not None else "")
        out.append((label if label != last else "", str(r.rank) if r.rank else "—", r.implementation,
                    _ms(r.median_ms) + spread, _ms(r.wall_ms), floor, _x(r.vs_first), peak,
                    _row_conformance(impls.get(r.implementation), r)))
        last = label
    return out


def floor_note(section: Section, protocol: str) -> str:
    rows = [r for r in section.rows if r.protocol == protocol]
    models = sorted({r.floor_model for r in rows if r.floor_model})
    ceilings = ", ".join(f"{k.split('_')[0]} {v:.2f} TB/s" for k, v in section.ceilings.items())
    return (f"x floor: median / the record's DRAM floor ({', '.join(models) or 'model not stated'}) at this run's "
            f"measured ceilings ({ceilings or 'not measured'}); masked members since 2026-12-02: the median "
            f"over calls of each call's time / the floor of its own inputs' mask; the datasheet ratio beside "
            f"it. vs #1: median / the "
            f"fastest conformant median on the same workload. wall: host-inclusive time per call.")


def impl_rows(section: Section) -> list[tuple[str, ...]]:
    return [(i.label or i.name, i.path, conformance(i), short(i.identity, 16), i.language, i.license,
             f"{i.signer.get('owner', '?')} (key {short(i.signer.get('keyid', ''), 12)})", i.finished,
             short(i.commit, 12), short(i.record_identity, 12) + (f" (newest of {i.records})" if i.records > 1 else ""))
            for i in section.implementations]


def reported_rows(rows: tuple[ReportedRow, ...]) -> list[tuple[str, ...]]:
    return [(f"{r.implementation} ({r.provider})" if r.provider else r.implementation, r.gpu,
             f"{r.workload or '—'}: {r.shape}", r.protocol, f"{r.median_ms:g}",
             _x(r.floor_ratio), r.label, r.audited_against, r.explanation, f"{r.source_file} {r.where}" + (f", {r.observed}" if r.observed
                                                                                       else ""))
            for r in rows]


def first_by_protocol(section: Section, protocol: str) -> Row | None:
    ranked = [r for r in section.rows if r.protocol == protocol and r.rank == 1]
    return max(ranked, key=lambda r: r.batch or 0) if ranked else None
