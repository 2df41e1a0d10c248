"""The example gallery: every folder under tests/gallery is an implementation with an expect.toml
saying which exit code `check` must give and which named checks must fail (and pass). Every new
way to cheat that anyone finds becomes a folder here.

A failing folder is checked with `-k` of the checks its expect.toml reads (`selection`): only the
probes feeding them run (checks/probes.py, `select`), so a folder costs its own probes, not all of
them, and each run is also the hostile case of the selection: a folder that fails X fails `-k X`.
A passing folder runs every probe (a verdict of conformance needs all of them)."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from conftest import GALLERY, cli_here
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.checks.probes import select as select_probes
from grpo_conform.checks.registry import CHECKS_BY_NAME
from grpo_conform.gate.selection import report_partial

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FOLDERS = sorted(p for p in GALLERY.iterdir() if (p / "expect.toml").is_file())
WORKLOADS = ("odd-vocab",)  # odd vocab, three sequences: enough for every check, fast on 2 cores


def _expect(folder):
    return tomllib.loads((folder / "expect.toml").read_text())


def selection(expect) -> tuple[str, ...]:
    """The checks a folder is run with: none (all) for a passing folder; for a failing one those it must
    fail and pass, the checks a deferred one defers to, and what its diagnosis and reports read."""
    if expect["exit_code"] == 0:
        return ()
    names = set(expect.get("fails", [])) | set(expect.get("passes", []))
    names |= {alt for alts in expect.get("fails_instead", {}).values() for alt in alts}
    if "diagnosis" in expect:
        names |= {"loss", "gradient"}
    if expect.get("reported"):
        names.add("determinism")
    return tuple(sorted(names))


def fail_fast(expect) -> bool:
    """A folder that must fail one check runs with -x: its workload stops after the probe where that check first
    fails (gallery: 122 s of the suite's CPU before, 68 s with -x). The checks it must pass are then judged on
    the calls made until then, so each must be fed by a probe no later than the first that feeds the failing
    check. Not a folder that names a diagnosis, reports, leaked inputs or a deferral: those read later probes."""
    others = ("fails_instead", "diagnosis", "reported", "reached_output")
    if expect["exit_code"] == 0 or len(expect.get("fails", [])) != 1 or any(k in expect for k in others):
        return False
    order = select_probes("full", selection(expect))
    first = lambda check: next((i for i, p in enumerate(order) if check in p.feeds), len(order))  # noqa: E731
    return all(first(c) <= first(expect["fails"][0]) for c in expect.get("passes", []))


def test_every_check_has_a_failing_example():
    named = {c for f in FOLDERS for c in _expect(f).get("fails", [])}
    missing = set(CHECKS_BY_NAME) - named - {"determinism"}  # determinism is reported, never failed
    assert not missing, f"checks without a gallery implementation that must fail them: {sorted(missing)}"


def _draws(impl, limit: int = 6000) -> str:
    """What each workload drew (the secret seeds' outcomes), for a folder a run did not catch: the validator draws
    afresh in every process, so a miss in CI cannot be replayed, only read (clean-clone runs 204 and 207 lost
    a miss for want of it). Truncated: enough to see the draw that hid the bug."""
    text = json.dumps({w.workload: w.draws for w in impl.workloads}, default=str, sort_keys=True)
    return "draws: " + (text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)")


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_gallery(folder):
    expect = _expect(folder)
    if expect.get("cuda_only") and not torch.cuda.is_available():
        pytest.skip("exercised on a GPU (timing checks need CUDA): see tests/gallery/README.md (cuda_only); "
                    "the last GPU run: benchmarks/results/h200-2026-11-30/gallery-cuda.txt")
    sandbox = expect.get("sandbox", "none")  # escapes-sandbox: what `check --sandbox bwrap` must stop
    if sandbox != "none":
        from grpo_conform.isolation.sandbox import SandboxUnavailable, preflight

        try:
            preflight(sandbox, "cuda" if torch.cuda.is_available() else "cpu")
        except SandboxUnavailable as exc:
            pytest.skip(f"needs --sandbox {sandbox}: {exc}")
    timeout = expect.get("timeout")
    started = time.monotonic()
    workloads = tuple(expect.get("workloads", WORKLOADS))  # a class that only other shapes expose
    checks = selection(expect)
    report = run_check(CheckRequest((str(folder),), device="auto", workloads=workloads, timeout=timeout,
                                    sandbox=sandbox, checks=checks, fail_fast=fail_fast(expect)))
    elapsed = time.monotonic() - started
    (impl,) = report.implementations
    assert report.exit_code == expect["exit_code"], f"{impl.message}\n{_draws(impl)}"
    # a narrowed run says so (never a full verdict), and every probe's findings were declared
    assert ("-k:" in (report_partial(report) or "")) == bool(checks) and impl.members[0].coverage.checks == checks
    assert not [w.draws["undeclared_findings"] for w in impl.workloads if "undeclared_findings" in w.draws]
    # a check fails for the folder when it fails on any of its workloads (the last workload's outcome used
    # to decide: a folder whose cheat shows on some draws only flaked when the last one missed it)
    outcomes = {o.check: o for w in impl.workloads for o in w.outcomes}
    outcomes |= {o.check: o for w in impl.workloads for o in w.outcomes if o.failed}
    instead = expect.get("fails_instead", {})
    for name in expect.get("fails", []):
        o = outcomes[name]
        if name in instead and o.status == "skipped" and "already wrong" in o.message:
            # The validator does not judge a metamorphic check on a gradient that already failed
            # (docs/checks.md): then the check it defers to must have failed.
            assert any(outcomes[alt].failed for alt in instead[name]), (name, o.message)
            continue
        assert o.failed, f"{name} should fail: {o.status} {o.message}\n{_draws(impl)}"
        if "status" in expect:
            assert outcomes[name].status == expect["status"]
    if "diagnosis" in expect:  # the failure names the neighbouring semantics (grpo_conform/ops/grpo_logits/diagnosis.py)
        named = [m["variant"] for w in impl.workloads for o in w.outcomes if o.check in ("loss", "gradient")
                 for m in (o.evidence.get("likely_cause") or {}).get("matches", [])]  # on any workload
        assert expect["diagnosis"] in named, (expect["diagnosis"], named)
    if "reached_output" in expect:  # a failed masked-positions names the inputs whose masked values leak
        assert outcomes["masked-positions"].evidence.get("reached_output") == expect["reached_output"]
    for name in expect.get("passes", []):
        o = outcomes[name]
        if o.status == "skipped" and "already wrong" in o.message:
            # Not judged because loss or gradient already failed on that call: the attribution keeps a
            # check failed when its own symptom shows (results.attribute_root_cause), so this is no
            # failure of its own; its verdict on the call is kept as evidence.
            assert o.evidence["not_judged"]["because"] in ("loss", "gradient"), o.evidence
            continue
        assert o.status == "pass", f"{name} should pass: {o.message}"
    if expect["exit_code"] == 0:
        assert impl.status == "conformant"
    if "determinism_bitwise" in expect.get("reported", {}):
        det = outcomes["determinism"]
        assert det.status == "pass" and det.informational
        assert det.evidence["bitwise_equal"] is expect["reported"]["determinism_bitwise"]
    if timeout:
        assert elapsed < timeout * 4 + 20, f"a hang must end within its timeout (took {elapsed:.1f} s)"


@pytest.mark.slow
def test_a_k_run_of_a_passing_folder_never_reads_conformant(tmp_path):
    """`check -k`: only the selected checks' probes run, and the command line, the summary and the
    record say it is partial; an implementation with no failure in them is never shown CONFORMANT."""
    from test_evidence_support import payload_of

    run = cli_here("check", GALLERY / "float64-eager", "--device", "cpu", "--workload", "odd-vocab", "-k",
                   "forward-only", "--evidence-dir", tmp_path / "ev")
    assert run.returncode == 0, run.stderr
    assert "CONFORMANT" not in run.stdout and "PARTIAL" in run.stdout, run.stdout
    assert "not a full verdict" in run.stdout + run.stderr
    (record,) = (tmp_path / "ev").glob("*.intoto.json")
    predicate = payload_of(record)["predicate"]
    assert predicate["selection"]["partial"] is True and "gradient" in predicate["selection"]["left_out"]["checks"]
    (workload,) = predicate["workloads"]
    assert workload["draws"].get("call_patterns") == ["no-grad", "frozen-all"]  # forward-only's probe alone ran
    assert {o["check"] for o in workload["checks"]} == {"runs", "forward-only"}
