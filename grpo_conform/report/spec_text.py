"""`spec show` and `spec validate` for people: the spec's summary lines (`Spec.summary_lines`, SPEC's)
grouped under headings (formula, inputs, outputs, parameters, constraints, ...), and validation that
reports every schema error of a file rather than the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema

from grpo_conform.spec import SpecError, is_family_document, load_family, load_spec, read_document
from grpo_conform.spec.documents import _describe, _json_path, _schema

#: summary-line key -> section heading; the order of SECTIONS is the order printed.
SECTIONS = ("Formula", "Inputs", "Outputs", "Parameters", "Constraints", "Tolerances", "Traffic (what floors count)",
            "Workloads", "Other")
KEYS = {"semantics": "Formula", "formula": "Formula", "ties": "Formula", "axes": "Inputs", "input": "Inputs",
        "output": "Outputs", "gradient": "Outputs", "parameters": "Parameters", "parameter": "Parameters",
        "terms": "Constraints", "constraints": "Constraints", "layouts": "Constraints", "tolerance": "Tolerances",
        "traffic": "Traffic (what floors count)", "workload": "Workloads"}
BRIEF = ("Formula", "Inputs", "Outputs", "Parameters", "Constraints")  # what a family listing shows per member


def _key(line: str) -> str | None:
    head = line.split(":", 1)[0].split(" ", 1)[0] if ":" in line else ""
    return head if head in KEYS else None


def spec_sections(spec: Any) -> tuple[list[str], dict[str, list[str]]]:
    """(description lines, {heading: lines with their key prefix removed where it repeats the heading})."""
    description: list[str] = []
    grouped: dict[str, list[str]] = {s: [] for s in SECTIONS}
    for line in spec.summary_lines():
        key = _key(line)
        if key is None:
            (grouped["Other"] if grouped["Formula"] or ":" in line.split(" ", 1)[0] else description).append(line)
            continue
        body = line.split(":", 1)[1].strip() if key in ("formula", "semantics", "axes", "parameters", "terms",
                                                        "constraints", "ties") else line
        if key == "semantics":
            body = "semantics: " + body
        elif key == "ties":
            body = "ties: " + body
        elif key == "axes":
            body = "axes: " + body
        grouped[KEYS[key]].append(body)
    sem = getattr(spec, "semantics", None)
    if not grouped["Formula"] and sem is not None and getattr(sem, "formula", ()):  # a standalone (v1) file
        grouped["Formula"] = [f"semantics: family {sem.family}, {sem.importance_sampling}-level ratio, "
                              f"reduction {sem.reduction}", *sem.formula]
        if getattr(sem, "old_logprobs", ""):
            grouped["Formula"].append(f"old log-probs: {sem.old_logprobs}")
    return description, {k: v for k, v in grouped.items() if v}


def spec_text(spec: Any, brief: bool = False) -> list[str]:
    """The lines `spec show` prints for one (resolved) spec."""
    out = [f"id:       {spec.id}", f"version:  {spec.version}", f"identity: sha256 {spec.identity}"]
    if getattr(spec, "source", None):
        out.append(f"file:     {spec.source}")
    description, sections = spec_sections(spec)
    out += [f"  {d.strip()}" for d in description]
    for title in SECTIONS:
        if title in sections and (not brief or title in BRIEF):
            out.append(f"{title}:")
            out += [f"  {line}" for line in sections[title]]
    return out


def validate_problems(file: str | Path) -> list[str]:
    """Every problem of a spec file (standalone or family), each `file: $.path: what`; [] when valid.
    All schema errors are listed; cross-reference checks, run only on a schema-valid document, stop at
    their first problem (they assume the shape the schema guarantees)."""
    try:
        doc = read_document(file)
    except SpecError as exc:
        return [str(exc)]
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        return [f"{file}: {_json_path(e.absolute_path)}: {_describe(e)}" for e in errors]
    try:
        if is_family_document(doc):
            load_family(file).members()
        else:
            load_spec(file)
    except SpecError as exc:
        return [str(exc)]
    return []
