"""`grpo-conform audit FILE`: judge reported timings that nobody here measured (docs/audit.md).

Two input forms: the project's own JSON (`grpo-conform-reported/1`, `ReportedFile`) and the CSV
that Liger-Kernel's benchmark scripts write. Every timing record is audited as a candidate record
of the spec's operation: is the GPU known, which spec workload it is, is the operation the spec's,
which protocol was timed, and is the time physically possible. A record presented as the
operation's latency must at least read every declared input once, so it is held against the
floor of its protocol (forward/full) or, for a backward-only record, the forward floor.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from grpo_conform.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, GrpoConformError
from grpo_conform.floors import (HEADROOM, TRAFFIC, FloorError, below_floor, compute_floor,
                                 format_ns, load_spec_ref, ratio)
from grpo_conform.hardware import Catalogue, load_catalogue
from grpo_conform.operations import KNOWN_OPERATIONS, lookup, measures_member
from grpo_conform.audit_against import build_against
from grpo_conform.audit_fused import DEFAULT_FUSED_SPEC, audit_fused_record, is_fused, stated_level
from grpo_conform.audit_model import Finding, IgnoredRow, Record, RecordAudit, match_workload
from grpo_conform.audit_repro import load_measurements
from grpo_conform.ops import operation_name
from grpo_conform.spec import Spec

FORMAT = "grpo-conform-reported/1"
FUSED_OPERATION = "grpo-fused-linear"
DEFAULT_SPEC = "grpo-token-is"
LIGER_COLUMNS = ("kernel_name", "kernel_provider", "kernel_operation_mode", "metric_name", "metric_unit",
                 "x_name", "x_label", "x_value", "y_value_50", "y_value_20", "y_value_80",
                 "extra_benchmark_config_str", "gpu_name", "timestamp", "liger_version")
LIGER_AXES = {"B": "batch", "T": "seq", "V": "vocab"}
TIME_UNITS_MS = {"ms": 1.0, "us": 1e-3, "µs": 1e-3, "s": 1e3, "ns": 1e-6}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp64": "float64", "double": "float64"}
#: Operation names other sources use and what each measures (grpo_conform.operations).
OPERATIONS = KNOWN_OPERATIONS
# The verdict is about physics; comparability (operation, protocol, workload) is reported beside it.
Verdict = Literal["impossible", "plausible", "unknown-gpu"]
VERDICTS: tuple[str, ...] = ("impossible", "plausible", "unknown-gpu")


class AuditInputError(GrpoConformError):
    """An audit input file that cannot be read; the message names the file, the place and the field."""

    exit_code = EXIT_USAGE

    def __init__(self, file: str | Path, where: str, problem: str):
        self.file, self.where, self.problem = str(file), where, problem
        super().__init__(f"{file}: {where}: {problem}")


class ReportedRecord(BaseModel):
    """One reported timing in the project's own form."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    implementation: str = Field(min_length=1)
    provider: str = ""
    operation: str = Field(min_length=1, description="a spec id (grpo-token-is) or another operation's name")
    protocol: Literal["forward", "full", "backward"]
    workload: dict[str, Union[StrictInt, str]] = Field(description="axis values by spec axis name, plus 'dtype'")
    gpu: str = Field(min_length=1)
    median_ms: float = Field(gt=0, allow_inf_nan=False)
    quantiles_ms: dict[str, float] = Field(default_factory=dict, description="e.g. {'p20': 1.80, 'p80': 1.83}")
    source: str = Field(min_length=1)
    observed: str = ""
    notes: str = ""


class ReportedFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["grpo-conform-reported/1"]
    description: str = ""
    records: tuple[ReportedRecord, ...] = Field(min_length=1)


def reported_schema() -> dict[str, Any]:
    """JSON Schema of the project's reported-records form."""
    return ReportedFile.model_json_schema()


def normalize_dtype(text: str) -> str:
    name = str(text).strip().removeprefix("torch.").lower()
    return DTYPE_ALIASES.get(name, name)


def parse_config_string(text: str) -> dict[str, Any]:
    """Liger's extra_benchmark_config_str: JSON, a Python dict repr (torch.bfloat16 unquoted), or k=v pairs."""
    text = (text or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        quoted = re.sub(r"(?<!['\"\w.])(torch\.\w+)", r"'\1'", text)
        try:
            value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            pairs = re.findall(r"['\"]?(\w+)['\"]?\s*[:=]\s*['\"]?([\w.+-]+)['\"]?", text)
            if not pairs:
                raise ValueError(f"cannot read {text!r} as JSON, a Python dict or key=value pairs") from None
            value = {k: int(v) if re.fullmatch(r"[+-]?\d+", v) else v for k, v in pairs}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of settings, got {type(value).__name__}")
    return value


def _number(raw: str | None, where: str, name: str, file: Path, *, optional: bool = False) -> Optional[float]:
    if raw is None or not raw.strip():
        if optional:
            return None
        raise AuditInputError(file, where, f"field {name!r} is empty; expected a number")
    try:
        value = float(raw)
    except ValueError:
        raise AuditInputError(file, where, f"field {name!r}: {raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise AuditInputError(file, where, f"field {name!r}: {raw!r} must be a finite number > 0")
    return value


def _int_value(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.0*)?\s*", value):
        return int(float(value))
    return None


def read_liger_csv(path: Path) -> tuple[list[Record], list[IgnoredRow]]:
    records: list[Record] = []
    ignored: list[IgnoredRow] = []
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in LIGER_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise AuditInputError(path, "line 1 (header)", f"missing columns {', '.join(missing)}; a Liger-Kernel "
                                  f"benchmark CSV has: {', '.join(LIGER_COLUMNS)}")
        for row in reader:
            where = f"line {reader.line_num}"
            if None in row or any(row[c] is None for c in LIGER_COLUMNS):
                raise AuditInputError(path, where, f"expected {len(reader.fieldnames or [])} fields per row")
            if row["metric_name"].strip() != "speed":
                ignored.append(IgnoredRow(where, f"metric {row['metric_name']!r} ({row['metric_unit']}) is not a "
                                                 "timing"))
                continue
            unit = row["metric_unit"].strip()
            if unit not in TIME_UNITS_MS:
                raise AuditInputError(path, where, f"field 'metric_unit': {unit!r} is not a time unit "
                                                   f"({', '.join(TIME_UNITS_MS)})")
            scale = TIME_UNITS_MS[unit]
            try:
                config = parse_config_string(row["extra_benchmark_config_str"])
            except ValueError as exc:
                raise AuditInputError(path, where, f"field 'extra_benchmark_config_str': {exc}") from None
            x_value = _int_value(row["x_value"])
            if x_value is None:
                raise AuditInputError(path, where, f"field 'x_value': {row['x_value']!r} is not an integer")
            config[row["x_name"].strip()] = x_value
            axes: dict[str, int] = {}
            extra: dict[str, Any] = {}
            dtype = None
            for key, value in config.items():
                if key == "dtype":
                    dtype = normalize_dtype(value)
                elif key in LIGER_AXES and _int_value(value) is not None:
                    axes[LIGER_AXES[key]] = _int_value(value)  # type: ignore[assignment]
                else:
                    extra[key] = value
            axes = {a: axes[a] for a in LIGER_AXES.values() if a in axes}
            median = _number(row["y_value_50"], where, "y_value_50", path)
            quantiles = {}
            for q, col in (("p20", "y_value_20"), ("p80", "y_value_80")):
                v = _number(row[col], where, col, path, optional=True)
                if v is not None:
                    quantiles[q] = v * scale
            version = row["liger_version"].strip()
            records.append(Record(where, row["kernel_provider"].strip(), f"Liger-Kernel {version} benchmark scripts",
                                  row["kernel_name"].strip(), row["kernel_operation_mode"].strip().lower(), axes,
                                  dtype, row["gpu_name"].strip(), median * scale, quantiles,  # type: ignore[operator]
                                  f"{path.name} {where}", row["timestamp"].strip(), extra))
    return records, ignored


def read_reported_json(path: Path, text: str) -> list[Record]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuditInputError(path, f"line {exc.lineno} column {exc.colno}", f"not valid JSON: {exc.msg}") from None
    try:
        parsed = ReportedFile.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise AuditInputError(path, where, f"{first['msg']} (format {FORMAT}: see docs/audit.md)") from None
    records = []
    for i, r in enumerate(parsed.records):
        where = f"records[{i}]"
        axes = {k: v for k, v in r.workload.items() if isinstance(v, int) and k != "dtype"}
        bad = [k for k, v in r.workload.items() if k != "dtype" and (not isinstance(v, int) or v < 1)]
        if bad:
            raise AuditInputError(path, f"$.{where}.workload.{bad[0]}", "axis values must be integers >= 1 (and "
                                  "'dtype' a dtype name)")
        dtype = r.workload.get("dtype")
        records.append(Record(where, r.implementation, r.provider, r.operation, r.protocol, axes,
                              normalize_dtype(str(dtype)) if dtype is not None else None, r.gpu, r.median_ms,
                              dict(r.quantiles_ms), r.source, r.observed))
    return records


def read_records(path: str | Path) -> tuple[str, list[Record], list[IgnoredRow]]:
    """Detect the form (extension, then content) and read every record."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise AuditInputError(path, "file", f"cannot read it: {exc.strerror}") from None
    suffix = path.suffix.lower()
    if suffix == ".json" or (suffix != ".csv" and text.lstrip().startswith("{")):
        return FORMAT, read_reported_json(path, text), []
    if suffix == ".csv" or text.split("\n", 1)[0].startswith("kernel_name"):
        records, ignored = read_liger_csv(path)
        return "liger-benchmark-csv", records, ignored
    raise AuditInputError(path, "file", f"cannot tell its form: expected {FORMAT} JSON (.json) or a Liger-Kernel "
                                        "benchmark CSV (.csv, header starting with kernel_name)")


# -- judging ------------------------------------------------------------------------------------
def _operation(record: Record, spec: Spec) -> Finding:
    name = record.operation.strip()
    if name.split("@")[0] == spec.id:
        return Finding("operation", "ok", f"{name!r} is the spec's operation")
    known = lookup(name)
    if known is None:
        return Finding("operation", "mismatch", f"{name!r} is not {spec.id} nor a known name for it")
    if known.relation == "member":
        if measures_member(known, spec.id, spec.member):
            return Finding("operation", "ok", f"{name!r} measures {known.member_id}: {known.note}")
        return Finding("operation", "mismatch", f"{name!r} measures member {known.member_id}, not {spec.id} "
                       f"(audit it with --spec {known.member_id}): {known.note}")
    if known.relation == "unstated" and spec.semantics.family == "grpo":
        return Finding("operation", "warning", f"{name!r}: {known.note}")
    return Finding("operation", "mismatch", f"{name!r} is a different operation from {spec.id}: {known.note}")


def _protocol(record: Record) -> Finding:
    if record.protocol in ("forward", "full"):
        return Finding("protocol", "ok", f"times the {record.protocol!r} protocol")
    if record.protocol == "backward":
        return Finding("protocol", "mismatch", "backward-only timing: the gradient may already have been computed "
                       "during forward, so this is not the latency of any declared protocol (forward or full)")
    return Finding("protocol", "mismatch", f"{record.protocol!r} is not a protocol of this project (forward, full, "
                   "backward)")


def audit_record(record: Record, spec: Spec, catalogue: Catalogue) -> RecordAudit:
    findings: list[Finding] = []
    match = catalogue.lookup(record.gpu)
    if match is None:
        findings.append(Finding("gpu", "unknown", f"{record.gpu!r} is not in the GPU catalogue: the time cannot be "
                                                  "checked against a datasheet floor"))
    else:
        findings.append(Finding("gpu", "warning" if match.note else "ok", match.note or f"{match.gpu.name}"))
    findings.append(_operation(record, spec))
    findings.append(_protocol(record))
    wl_finding, workload = match_workload(record, spec)
    findings.append(wl_finding)
    q = record.quantiles_ms
    if q and not (q.get("p20", 0) <= record.median_ms <= q.get("p80", math.inf)):
        findings.append(Finding("quantiles", "warning",
                                f"median {record.median_ms:g} ms lies outside its quantiles {q}"))
    floor = None
    floor_ratio = None
    if match is None or workload is None:
        findings.append(Finding("physics", "skipped", "no datasheet floor without a known GPU and a full workload"))
    else:
        # traffic-v1, the model check and bench use. A backward-only time presented as the operation's
        # latency claims the gradient work, whose cheapest declared protocol is full (docs/audit.md).
        judged = record.protocol if record.protocol in ("forward", "full") else "full"
        resolved = spec.resolve(workload)
        try:
            floor = compute_floor(spec, resolved, judged, match.gpu, model=TRAFFIC)
            seed_page = compute_floor(spec, resolved, "forward", match.gpu, model=HEADROOM)
        except FloorError as exc:
            findings.append(Finding("physics", "skipped", str(exc)))
        else:
            time_ns = record.median_ms * 1e6
            floor_ratio = ratio(time_ns, floor) if floor.floor_ns else None
            basis = "" if judged == record.protocol else (" (a backward-only time presented as the operation's "
                                                          "latency claims its gradient work: judged as full)")
            beside = f"; {HEADROOM} forward floor, as the seed page computed it: {format_ns(seed_page.dram_ns)}"
            if below_floor(time_ns, floor):
                findings.append(Finding("physics", "impossible", f"{record.median_ms:g} ms is below the {judged} "
                                        f"floor of {spec.id} on {match.gpu.name} ({TRAFFIC}): what it must read "
                                        f"and write ({floor.bytes_total:,} B) needs {format_ns(floor.strict_ns)} at "
                                        f"{match.gpu.dram_gbps:,.0f} GB/s{basis}{beside}"))
            else:
                shown = f"{floor_ratio:.2f}x" if floor_ratio is not None else "above"
                findings.append(Finding("physics", "ok", f"{shown} the {judged} floor "
                                        f"({format_ns(floor.floor_ns)} on {match.gpu.name}, {TRAFFIC}): physically "
                                        f"possible{basis}{beside}"))
    status = {f.check: f.status for f in findings}
    comparable = "mismatch" not in (status["operation"], status["protocol"], status["workload"])
    if status.get("physics") == "impossible":
        verdict = "impossible"
    elif match is None:
        verdict = "unknown-gpu"
    else:
        verdict = "plausible"
    return RecordAudit(record, verdict, tuple(findings), comparable, match, workload.name if workload and
                       workload.name != "reported" else None, floor, floor_ratio)


@dataclass(frozen=True)
class AuditRequest:
    path: str
    spec: str = DEFAULT_SPEC  # a spec file or id
    catalogue_path: Optional[str] = None
    # Rows of Liger's fused lm_head + GRPO kernel are judged against this spec (audit_fused.py), unless
    # `spec` itself is of that operation
    fused_spec: str = DEFAULT_FUSED_SPEC
    against: Optional[str] = None  # Liger's own benchmark CSV: which of its rows a number is (audit_against.py)
    records: Optional[tuple[str, ...]] = None  # our record folders for the reproduction (audit_repro.py);
    # None: evidence/h200; (): no reproduction
    trusted_keys: Optional[str] = None
    accept_unsigned_records: bool = False  # tests and local trials: read unsigned records, marked UNSIGNED


@dataclass(frozen=True)
class AuditReport:
    file: str
    format: str
    spec: Spec
    audits: tuple[RecordAudit, ...]
    ignored: tuple[IgnoredRow, ...] = ()
    fused_spec: Optional[Spec] = None  # the spec the fused-linear rows were judged against, if any

    @property
    def counts(self) -> dict[str, int]:
        counts = {v: sum(a.verdict == v for a in self.audits) for v in VERDICTS}
        counts["not-comparable"] = sum(not a.comparable for a in self.audits)
        return counts

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.counts["impossible"] else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "format": self.format,
                "spec": {"id": self.spec.id, "version": self.spec.version, "identity": {"sha256": self.spec.identity}},
                "fused_spec": {"id": self.fused_spec.id, "version": self.fused_spec.version,
                               "identity": {"sha256": self.fused_spec.identity}} if self.fused_spec else None,
                "counts": self.counts, "records": [a.to_json() for a in self.audits],
                "ignored": [asdict(i) for i in self.ignored], "exit_code": self.exit_code}

    def fused_text(self) -> str:
        if self.fused_spec is None or self.fused_spec is self.spec:
            return ""
        return f"; rows of the fused lm_head + GRPO kernel against {self.fused_spec.id} {self.fused_spec.version}"

    def lines(self) -> list[str]:
        out = [f"audit of {self.file} ({self.format}: {len(self.audits)} timing records, {len(self.ignored)} other "
               f"rows) against {self.spec.id} {self.spec.version}" + self.fused_text()]
        for a in self.audits:
            out += a.lines()
        out += [f"{i.where}: ignored: {i.reason}" for i in self.ignored]
        c = self.counts
        out.append("verdicts: " + ", ".join(f"{c[v]} {v}" for v in VERDICTS)
                   + f"; {c['not-comparable']} not comparable with {self.spec.id} (operation, protocol or workload)")
        return out


def run_audit(request: AuditRequest) -> AuditReport:
    spec = load_spec_ref(request.spec)
    catalogue = load_catalogue(request.catalogue_path)
    form, records, ignored = read_records(request.path)
    fused = [r for r in records if is_fused(r)]
    if not fused:
        return AuditReport(request.path, form, spec, tuple(audit_record(r, spec, catalogue) for r in records),
                           tuple(ignored))
    fused_spec = spec if operation_name(spec) == FUSED_OPERATION else load_spec_ref(request.fused_spec)
    against = build_against(request.against, read_records(request.against)[1]) if request.against else None
    audits = []
    for r in records:
        if not is_fused(r):
            audits.append(audit_record(r, spec, catalogue))
            continue
        source_row = against.finding(r) if against is not None else None
        if source_row is None and stated_level(r)[0] is None:
            source_row = Finding("source-row", "unknown", "the row does not state its importance-sampling level; "
                                 "give Liger's CSV with --against to tell its token- from its sequence-level rows")
        audits.append(audit_fused_record(r, fused_spec, catalogue, source_row))
    if request.records != ():
        measured = load_measurements(request.records or (), trusted_keys=request.trusted_keys,
                                     accept_unsigned=request.accept_unsigned_records)
        audits = [dataclasses.replace(a, reproduction=measured.reproduce(a)) if a.spec_id else a for a in audits]
    return AuditReport(request.path, form, spec, tuple(audits), tuple(ignored), fused_spec)
