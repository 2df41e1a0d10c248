"""Failures that point at the cause: dependent checks are "not judged" once loss/gradient failed,
and a failed run ends with a summary line and the first failure's evidence, whole."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from conftest import GALLERY
from grpo_conform.report.failures import evidence_lines, failure_lines, first_failure, summary_line
from grpo_conform.results import (REFERENCE_DEPENDENT, CheckOutcome, ImplementationResult, WorkloadResult,
                                  not_judged)

WORST = [{"index": [0, 1, i], "actual": 0.5 + i, "expected": 0.25, "allowed": 1e-5} for i in range(5)]
GRAD_EVIDENCE = {"elements": 75045, "mismatches": 134, "nan": 0, "inf": 0, "worst": WORST}
LONG = "call A: 134/75045 elements outside tolerance; " + "worst at [0, 0, 434] ... " * 30 + "END-OF-MESSAGE"


def _workload(*outcomes: CheckOutcome) -> WorkloadResult:
    return WorkloadResult("odd-vocab", {"batch": 3, "seq": 5, "seq_next": 6, "vocab": 5003}, {}, "cpu", (1, 2),
                          tuple(outcomes))


def _impl(*workloads: WorkloadResult) -> ImplementationResult:
    return ImplementationResult("bf16", "tests/gallery/bf16-arithmetic", "ab" * 32, {}, "failed", "failed: gradient",
                                tuple(workloads))


def test_reference_mismatches_after_a_wrong_gradient_are_not_judged():
    w = _workload(
        CheckOutcome("loss", "pass", "call A: ok"),
        CheckOutcome("gradient", "fail", LONG, dict(GRAD_EVIDENCE)),
        CheckOutcome("freshness", "fail", "call C: results do not follow the new inputs",
                     {"gradient": dict(GRAD_EVIDENCE), "loss": {"abs_error": 0.0, "allowed": 1e-5}}),
        CheckOutcome("adversarial-inputs", "fail", "profiles ...: 141/75045 elements", dict(GRAD_EVIDENCE)),
        CheckOutcome("zero-advantage", "fail", "advantage[1] = 0: 7 non-zero gradient values", {"nonzero": 7}),
        CheckOutcome("advantage-sign", "fail", "negating the advantages did not negate the gradient",
                     {"compared_with": "-gradient of call A", **GRAD_EVIDENCE}),
        CheckOutcome("no-mutation", "pass", "unchanged"),
    )
    by = {o.check: o for o in w.outcomes}
    for name in ("freshness", "adversarial-inputs"):
        o = by[name]
        assert not_judged(o) and not o.failed and o.status == "skipped"
        assert o.message == "not judged: the gradient is already wrong (see gradient)"
        assert o.evidence["not_judged"]["status"] == "fail"  # its own verdict is kept, not erased
    # Failures of their own stay judged: a non-zero gradient where A = 0; two outputs compared with each other.
    assert by["zero-advantage"].failed and by["advantage-sign"].failed
    assert by["gradient"].failed and by["no-mutation"].status == "pass"


def test_a_wrong_loss_is_named_when_the_gradient_matched():
    w = _workload(CheckOutcome("loss", "fail", "|1 - 2| > 1e-5", {"abs_error": 1.0}),
                  CheckOutcome("gradient", "pass", "all elements within tolerance", {"mismatches": 0}),
                  CheckOutcome("freshness", "fail", "results do not follow the new inputs: all elements within "
                               "tolerance", {"gradient": {"mismatches": 0, "nan": 0, "inf": 0}}),
                  CheckOutcome("forward-only", "fail", "loss differs", {"loss": {"abs_error": 1.0}}))
    by = {o.check: o for o in w.outcomes}
    assert by["freshness"].message == "not judged: the loss is already wrong (see loss)"
    assert by["forward-only"].message == "not judged: the loss is already wrong (see loss)"


def test_without_a_root_cause_nothing_changes():
    outcomes = (CheckOutcome("gradient", "pass", "ok"), CheckOutcome("freshness", "fail", "stale", GRAD_EVIDENCE))
    assert _workload(*outcomes).outcomes == outcomes
    assert {"freshness", "stale-output", "zero-advantage", "row-locality", "adversarial-inputs"} <= REFERENCE_DEPENDENT


def test_the_summary_and_the_first_failure_in_full():
    w = _workload(CheckOutcome("runs", "pass", "ok"),
                  CheckOutcome("no-mutation", "fail", "call A: logits changed during forward", {"changes": {}}),
                  CheckOutcome("gradient", "fail", LONG, dict(GRAD_EVIDENCE)),
                  CheckOutcome("freshness", "fail", "x", {"gradient": dict(GRAD_EVIDENCE)}))
    impl = _impl(w, w)
    line = summary_line(impl)
    assert line.startswith("bf16 FAILED: 2 check(s) failed: ")
    assert "gradient (2 of 2 workloads)" in line and "2 not judged" in line and "2 passed" in line
    member, wl, o = first_failure(impl)
    assert o.check == "gradient"  # the root cause goes on top, before no-mutation in run order
    lines = failure_lines(impl)
    assert lines[1].endswith("END-OF-MESSAGE")  # never truncated
    assert sum("index=[0, 1," in x for x in lines) == 5  # every worst element listed


def test_evidence_lines_keep_tracebacks_and_output_tails_whole():
    ev = {"kind": "exception", "error": {"type": "ValueError", "traceback": "Traceback:\n  File impl.py, line 3\n"
                                         "ValueError: boom"}, "output_tail": "line1\nline2", "samples": list(range(40))}
    text = "\n".join(evidence_lines(ev))
    assert "  File impl.py, line 3" in text and "ValueError: boom" in text and "line2" in text
    assert "28 more in --format json" in text


@pytest.mark.slow
def test_bf16_arithmetic_fails_with_one_root_cause_on_top():
    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.render import render_check

    # -k: the failing gradient and two reference-dependent checks it sets aside (only their probes run)
    report = run_check(CheckRequest((str(GALLERY / "bf16-arithmetic"),), device="cpu", workloads=("odd-vocab",),
                                    checks=("gradient", "freshness", "stale-output")))
    (impl,) = report.implementations
    outcomes = [o for w in impl.workloads for o in w.outcomes]
    assert first_failure(impl)[2].check == "gradient"
    assert not [o.check for o in outcomes if o.failed and o.check in REFERENCE_DEPENDENT]
    assert any(not_judged(o) for o in outcomes)
    buf = io.StringIO()
    render_check(report, Console(file=buf, width=120, soft_wrap=False))
    text = buf.getvalue()
    assert "NOT JUDGED" in text and "bf16-arithmetic FAILED: " in text
    assert "first failure: " in text and "/ gradient (fail): call A" in text
