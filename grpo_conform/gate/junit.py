"""`--junit-xml FILE`: the run as JUnit XML, for CI systems that show test results.

One <testsuite> per implementation x spec member; one <testcase> per workload x check, named
`workload::check` with classname `grpo_conform.<implementation>.<member>`. A failed check is a
<failure> whose text is its evidence (JSON); a skipped check, or every check of a workload that
did not run, is <skipped> with the reason (under --strict a workload that did not run is a
<failure> of type `strict`). An implementation that did not load is an <error> in a `load` test
case; a skipped one is a skipped `load` test case. Deselected workloads (--workload, --shard,
device) are not test cases: they were not asked for; but a suite whose run left out checks,
workloads or members (-k, --workload, --member, --shard) is named "(partial)", has the properties
`selection.partial` and `selection.left_out`, and a skipped `selection` test case saying what was
left out, so a narrowed run never reads as a full verdict (issue 28).
"""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from grpo_conform.checks.registry import CHECKS_BY_NAME
from grpo_conform.gate.selection import describe, selection_block
from grpo_conform.results import INTERNAL_ERROR, STRICT_KINDS

# What a workload reports on any device (the static tamper-scan included); timing checks only on CUDA.
WORKLOAD_CHECKS = tuple(n for n, c in CHECKS_BY_NAME.items() if not c.cuda_only)
MAX_TEXT = 20_000  # characters of evidence per failure: enough for the worst indices, bounded


def _clean(text: str) -> str:
    # XML 1.0 refuses most control characters (an implementation's stderr may hold them)
    return "".join(c for c in text if c in "\t\n\r" or ord(c) >= 0x20)


def _case(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name)


def _child(case: ET.Element, tag: str, message: str, kind: str = "", text: str = "") -> None:
    el = ET.SubElement(case, tag, message=_clean(message)[:1000])
    if kind:
        el.set("type", kind)
    if text:
        el.text = _clean(text)[:MAX_TEXT]


def _suite(root: ET.Element, name: str, report: Any, impl: Any, spec: Any, left_out: str = "") -> ET.Element:
    suite = ET.SubElement(root, "testsuite", name=name, timestamp=report.started or "", hostname=socket.gethostname())
    props = ET.SubElement(suite, "properties")
    for key, value in (("implementation.identity", impl.identity), ("implementation.path", impl.path),
                       ("spec.id", getattr(spec, "id", "")), ("spec.identity", getattr(spec, "identity", "")),
                       ("device", str(report.device.get("name") or report.device.get("kind", ""))),
                       ("selection.partial", "true" if left_out else "false"),
                       *((("selection.left_out", left_out),) if left_out else ())):
        ET.SubElement(props, "property", name=key, value=str(value))
    return suite


def build_junit(report: Any) -> ET.ElementTree:
    root = ET.Element("testsuites", name="grpo-conform")
    for impl in report.implementations:
        members = impl.members or ()
        for m in members:
            label = m.member
            selection = selection_block(report, impl, m)
            left_out = describe(selection) if selection["partial"] else ""
            suite = _suite(root, f"{impl.name} {label}" + (" (partial)" if left_out else ""), report, impl, m.spec,
                           left_out)
            classname = f"grpo_conform.{impl.name}.{label}".replace("/", ".")
            if left_out:  # visible where CI shows test results, not only in the properties
                _child(_case(suite, classname, "selection"), "skipped", f"partial run, not a full verdict: {left_out}")
            if m.status in ("load-error", "skipped") and not m.workloads:
                case = _case(suite, classname, "load")
                if m.status == "load-error":
                    _child(case, "error", m.message.splitlines()[0] if m.message else "load error", "load-error",
                           m.message)
                elif report.strict:
                    _child(case, "failure", f"skipped, and --strict fails skips: {m.message}", "strict")
                else:
                    _child(case, "skipped", m.message)
            for w in m.workloads:
                for o in w.outcomes:
                    case = _case(suite, classname, f"{w.workload}::{o.check}")
                    evidence = json.dumps(o.evidence, indent=1, sort_keys=True, default=str)
                    if o.failed:
                        _child(case, "failure", o.message, o.status, evidence)
                    elif INTERNAL_ERROR in o.evidence:  # grpo-conform's own bug: an error, as JUnit means it
                        _child(case, "error", o.message, "internal-error", evidence)
                    elif o.status == "skipped":
                        _child(case, "skipped", o.message)
                    elif o.informational:
                        ET.SubElement(case, "system-out").text = _clean(f"{o.message}\n{evidence}")[:MAX_TEXT]
            checks = m.coverage.checks or WORKLOAD_CHECKS
            for n in m.coverage.not_run:
                if n.kind in ("deselected", "device", "elsewhere"):
                    continue
                for check in checks:
                    case = _case(suite, classname, f"{n.workload}::{check}")
                    if report.strict and n.kind in STRICT_KINDS:
                        _child(case, "failure", f"not run, and --strict fails skips: {n.reason}", "strict")
                    else:
                        _child(case, "skipped", n.reason)
        if not members:  # results of an older producer: one suite from the flat view
            suite = _suite(root, impl.name, report, impl, None)
            case = _case(suite, f"grpo_conform.{impl.name}", "load")
            if impl.status == "load-error":
                _child(case, "error", impl.message, "load-error", impl.message)
            elif impl.status == "skipped":
                _child(case, "skipped", impl.message)
    _count(root)
    ET.indent(root)
    return ET.ElementTree(root)


def _count(root: ET.Element) -> None:
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        n = dict(tests=len(cases), failures=sum(1 for c in cases if c.find("failure") is not None),
                 errors=sum(1 for c in cases if c.find("error") is not None),
                 skipped=sum(1 for c in cases if c.find("skipped") is not None))
        for k, v in n.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))


def write_junit(report: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    build_junit(report).write(path, encoding="utf-8", xml_declaration=True)
    return path
