"""A narrowed run never reads as a full verdict (issue 28 point 3): with -k, --workload, --member or
--shard the record's `selection` block, the verdict line, the JUnit report and the Markdown summary say
"partial" and what was left out, and `verify --require-full-coverage` refuses the record. The review's
case: a record made with `-k finite` (two checks reported) verified as plainly conformant."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from grpo_conform.check import CheckReport
from grpo_conform.evidence import Policy, build_statement
from grpo_conform.evidence.statement import schema_problems
from grpo_conform.gate.junit import build_junit
from grpo_conform.gate.progress import summary_line
from grpo_conform.gate.selection import EXTENDED_REASON, WORKLOAD_REASON, partial_reason
from grpo_conform.gate.summary import build_summary
from grpo_conform.results import Coverage, MemberResult, NotRun
from test_evidence_support import (make_project, make_trust_root, new_key, outcome, signed_record, synthetic_impl,
                                   synthetic_report, verify)

FINITE_ONLY = (outcome("runs", "pass"), outcome("finite", "pass"))


@pytest.fixture()
def project(tmp_path, monkeypatch):
    project = make_project(tmp_path / "proj")
    monkeypatch.chdir(project)  # record paths are relative to it
    return project


def _run(project, checks=(), not_run=(), declared=(), shard=None, outcomes=None):
    """A CheckReport of one member that ran seed-b2, with the given selection."""
    impl = synthetic_impl(project / "implementations" / "pytorch", outcomes=outcomes)
    base = synthetic_report(project, impl)
    spec = next(iter(base.specs.values()))
    cov = Coverage(("seed-b2",), tuple(not_run), tuple(checks))
    member = MemberResult(spec, "conformant", "conformant", impl.workloads, cov)
    manifest = {**impl.manifest, **({"members": list(declared)} if declared else {})}
    impl = dataclasses.replace(impl, manifest=manifest, members=(member,))
    return CheckReport(base.device, True, (impl,), base.specs, base.started, base.finished, base.software, {},
                       shard=shard)


def _statement(report):
    impl = report.implementations[0]
    return build_statement(report, impl, impl.members[0])


def test_a_k_record_is_partial_says_what_was_left_out_and_full_coverage_refuses_it(project, tmp_path):
    # The spec's other workloads are not run on this device: verify's semantics step wants every
    # workload of the member accounted for (coverage adds up to the spec).
    spec = next(iter(_run(project).specs.values()))
    elsewhere = tuple(NotRun(w.name, "not run on cpu", "device") for w in spec.workloads if w.name != "seed-b2")
    report = _run(project, checks=("finite",), outcomes=FINITE_ONLY, not_run=elsewhere)
    st = _statement(report)
    sel = st["predicate"]["selection"]
    assert sel["partial"] is True and sel["checks"] == ["finite"] and sel["shard"] is None
    assert "loss" in sel["left_out"]["checks"] and "gradient" in sel["left_out"]["checks"]
    assert "runs" not in sel["left_out"]["checks"]  # always reported
    assert sel["workloads"] is None and sel["members"] is None
    assert st["predicate"]["summary"].startswith("partial, conformant on what was selected: checks finite only")
    assert schema_problems(st) == []
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    path = signed_record(project / "evidence" / "k.intoto.json", st, key)
    assert verify(path, trust).files[0].ok  # a partial record is a valid record ...
    strict = verify(path, trust, policy=Policy(require_full_coverage=True))
    step = strict.files[0].step("policy")
    assert not strict.files[0].ok  # ... but never passes for a full verdict
    assert "partial: checks finite only" in step.message + " ".join(step.notes)
    # and through the command line, as a CI job would ask
    base = [sys.executable, "-m", "grpo_conform", "verify", path, "--trust-root", str(trust.folder)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(base + ["--require-full-coverage"], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "partial: checks finite only" in done.stdout


def test_workload_member_and_shard_selections_are_partial(project):
    not_run = (NotRun("seed-b4", WORKLOAD_REASON, "deselected"), NotRun("seed-b8", "run in another shard (2/2)",
                                                                         "elsewhere"))
    st = _statement(_run(project, not_run=not_run, declared=("grpo-token-is", "dapo-mask"), shard=(1, 2)))
    sel = st["predicate"]["selection"]
    assert sel["partial"] is True and sel["shard"] == "1/2"
    assert [w["workload"] for w in sel["left_out"]["workloads"]] == ["seed-b4", "seed-b8"]
    assert sel["workloads"] == ["seed-b2"]
    assert sel["left_out"]["members"] == ["dapo-mask"] and sel["members"] == ["grpo-token-is"]
    reason = partial_reason(st["predicate"])
    assert "2 workload(s) left out (seed-b4, seed-b8)" in reason and "dapo-mask" in reason


def test_device_and_extended_tier_are_not_a_selection(project):
    not_run = (NotRun("seed-b4", "not run on cpu", "device"), NotRun("long", EXTENDED_REASON, "deselected"))
    report = _run(project, not_run=not_run)
    st = _statement(report)
    assert st["predicate"]["selection"]["partial"] is False
    assert st["predicate"]["selection"]["left_out"] == {"checks": [], "workloads": [], "members": []}
    assert "PARTIAL" not in summary_line(report)
    # what did not run is still said by coverage, and full coverage still means every workload
    assert partial_reason(st["predicate"]).startswith("partial: covers 1 of 3 workloads")
    assert partial_reason({"coverage": {"complete": True, "checked": 1, "total": 1}}) is None


def test_the_schema_refuses_a_selection_that_hides_what_it_left_out(project):
    st = _statement(_run(project, checks=("finite",), outcomes=FINITE_ONLY))
    st["predicate"]["selection"]["partial"] = False  # left_out lists checks: partial must be true
    assert any("selection" in p for p in schema_problems(st))
    st["predicate"]["selection"]["partial"] = True
    st["predicate"]["selection"]["left_out"]["extra"] = []
    assert any("selection.left_out" in p for p in schema_problems(st))
    del st["predicate"]["selection"]  # records made before the block existed stay valid
    assert schema_problems(st) == []


def test_verdict_line_junit_and_summary_say_partial(project):
    full = _run(project)
    narrowed = _run(project, checks=("finite",), outcomes=FINITE_ONLY,
                    not_run=(NotRun("seed-b4", WORKLOAD_REASON, "deselected"),))
    assert "PARTIAL" not in summary_line(full)
    line = summary_line(narrowed)
    assert "PARTIAL (-k: 1 of " in line and "1 workload(s) left out" in line and "not a full verdict" in line
    root = build_junit(narrowed).getroot()
    (suite,) = root.iter("testsuite")
    assert suite.get("name").endswith("(partial)")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["selection.partial"] == "true" and "checks finite only" in props["selection.left_out"]
    case = next(c for c in suite.iter("testcase") if c.get("name") == "selection")
    assert "partial run, not a full verdict" in case.find("skipped").get("message")
    (plain,) = build_junit(full).getroot().iter("testsuite")
    assert not plain.get("name").endswith("(partial)")
    assert not any(c.get("name") == "selection" for c in plain.iter("testcase"))
    assert ET.tostring(plain).count(b'"selection.partial" value="false"') == 1
    md = build_summary(narrowed)
    assert md.startswith("## grpo-conform: PASSED (partial)") and "not a full verdict" in md
    assert "(partial)" not in build_summary(full)
