"""The example gallery: every folder under tests/gallery is an implementation with an expect.toml
saying which exit code `check` must give and which named checks must fail (and pass). Every new
way to cheat that anyone finds becomes a folder here."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from conftest import GALLERY
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.checks.registry import CHECKS_BY_NAME

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FOLDERS = sorted(p for p in GALLERY.iterdir() if (p / "expect.toml").is_file())
WORKLOADS = ("odd-vocab",)  # odd vocab, three sequences: enough for every check, fast on 2 cores


def _expect(folder):
    return tomllib.loads((folder / "expect.toml").read_text())


def test_every_check_has_a_failing_example():
    named = {c for f in FOLDERS for c in _expect(f).get("fails", [])}
    missing = set(CHECKS_BY_NAME) - named - {"determinism"}  # determinism is reported, never failed
    assert not missing, f"checks without a gallery implementation that must fail them: {sorted(missing)}"


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
    report = run_check(CheckRequest((str(folder),), device="auto", workloads=workloads, timeout=timeout,
                                    sandbox=sandbox))
    elapsed = time.monotonic() - started
    assert report.exit_code == expect["exit_code"], report.implementations[0].message
    (impl,) = report.implementations
    outcomes = {o.check: o for w in impl.workloads for o in w.outcomes}
    instead = expect.get("fails_instead", {})
    for name in expect.get("fails", []):
        o = outcomes[name]
        if name in instead and o.status == "skipped" and "already wrong" in o.message:
            # The validator does not judge a metamorphic check on a gradient that already failed
            # (docs/checks.md): then the check it defers to must have failed.
            assert any(outcomes[alt].failed for alt in instead[name]), (name, o.message)
            continue
        assert o.failed, f"{name} should fail: {o.status} {o.message}"
        if "status" in expect:
            assert outcomes[name].status == expect["status"]
    if "diagnosis" in expect:  # the failure names the neighbouring semantics (grpo_conform/ops/grpo_logits/diagnosis.py)
        named = [m["variant"] for check in ("loss", "gradient") if check in outcomes
                 for m in (outcomes[check].evidence.get("likely_cause") or {}).get("matches", [])]
        assert expect["diagnosis"] in named, (expect["diagnosis"], named)
    if "reached_output" in expect:  # a failed masked-positions names the inputs whose masked values leak
        assert outcomes["masked-positions"].evidence.get("reached_output") == expect["reached_output"]
    for name in expect.get("passes", []):
        assert outcomes[name].status == "pass", f"{name} should pass: {outcomes[name].message}"
    if expect["exit_code"] == 0:
        assert impl.status == "conformant"
    if "determinism_bitwise" in expect.get("reported", {}):
        det = outcomes["determinism"]
        assert det.status == "pass" and det.informational
        assert det.evidence["bitwise_equal"] is expect["reported"]["determinism_bitwise"]
    if timeout:
        assert elapsed < timeout * 4 + 20, f"a hang must end within its timeout (took {elapsed:.1f} s)"
