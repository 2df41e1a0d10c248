"""An exception of grpo-conform's own judging ends its workload, not the run (checks/internal.py).

On the H200 a KeyError in checks/reference_cache.py ended `grpo-conform check` with a traceback and
no record for the workloads already judged. Here the parent's judging raises on one workload (a
monkeypatched `WorkloadConformance.judge`): that workload is reported as an internal error (type, message, a
request to report it), the other still runs and passes, the record is written and verifies, the
member is never conformant and the run exits 3. Ctrl-C and SIGTERM (BaseException) still stop it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.checks.conformance import WorkloadConformance
from grpo_conform.gate.junit import build_junit
from grpo_conform.gate.progress import summary_line
from grpo_conform.gate.signals import Terminated
from grpo_conform.results import INTERNAL_ERROR, CheckOutcome, WorkloadResult, internal_error, member_status

PYTORCH = str(ROOT / "implementations" / "pytorch")
BROKEN = "batch1-seq1"  # vocab 4099: the workload whose judging raises
FINE = "fp32-small"
ARGS = ["check", PYTORCH, "--member", "token-is", "--workload", FINE, "--workload", BROKEN, "--device", "cpu"]


def _raise_on(vocab: int, exc: BaseException, monkeypatch) -> None:
    """Every judgment of a call on the workload of this vocabulary raises `exc` (the engine's `judge`:
    reference, cache and comparison behind one method)."""
    judge = WorkloadConformance.judge

    def broken(self, *args, **kwargs):
        if self.rw.axes["vocab"] == vocab:
            raise exc
        return judge(self, *args, **kwargs)

    monkeypatch.setattr(WorkloadConformance, "judge", broken)


@pytest.mark.slow
def test_an_exception_in_judging_is_that_workload_s_internal_error(monkeypatch, tmp_path):
    from grpo_conform.cli import main

    _raise_on(4099, KeyError(("P", 3)), monkeypatch)
    evidence = tmp_path / "evidence"
    result = CliRunner().invoke(main, ARGS + ["--evidence-dir", str(evidence), "--format", "json"])
    assert result.exit_code == 3, result.output  # a tool problem, not 1 (failed) and never 0
    report = json.loads(result.stdout[result.stdout.index("{"):])
    (impl,) = report["implementations"]
    (member,) = impl["members"]
    assert member["status"] == "skipped" and "internal error" in member["message"], member["message"]
    workloads = {w["workload"]: w for w in member["workloads"]}
    assert set(workloads) == {FINE, BROKEN}  # both ran: the broken one did not end the run
    fine = workloads[FINE]
    assert INTERNAL_ERROR not in fine.get("draws", {})
    assert all(c["status"] in ("pass", "skipped") for c in fine["checks"])
    assert {c["check"] for c in fine["checks"] if c["status"] == "pass"} >= {"loss", "gradient"}
    broken = workloads[BROKEN]
    info = broken["draws"][INTERNAL_ERROR]
    assert info["type"] == "KeyError" and "'P', 3" in info["message"] and "please report" in info["report"]
    assert any("_raise_on" in f or "broken" in f for f in info["traceback"])
    by_check = {c["check"]: c for c in broken["checks"]}
    for check in ("loss", "gradient"):  # what the raising judgment was for: not judged, never passed
        assert by_check[check]["status"] == "skipped", by_check[check]
        assert "internal error of grpo-conform" in by_check[check]["message"]
        assert "KeyError" in by_check[check]["message"] and "please report" in by_check[check]["message"]
    assert not any(c["status"] in ("fail", "error", "timeout") for c in broken["checks"])  # nothing blamed
    assert "internal error of grpo-conform" in result.stderr and "please report" in result.stderr
    # the record of the member is written, holds both workloads, verifies, and is not a success
    (record,) = report["evidence_records"]
    verified = CliRunner().invoke(main, ["verify", record["path"], "--allow-unsigned", "--format", "json"])
    assert verified.exit_code == 0, verified.output
    payload = json.loads(_payload(record["path"]))
    predicate = payload["predicate"]
    assert predicate["verdict"] == "skipped" and predicate["result"] == "FAILED"
    assert {w["workload"] for w in predicate["workloads"]} == {FINE, BROKEN}


def _payload(path: str) -> str:
    import base64

    return base64.b64decode(json.loads(Path(path).read_text())["payload"]).decode()


@pytest.mark.slow
@pytest.mark.parametrize("exc", [KeyboardInterrupt(), Terminated()], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_in_judging_still_stops_the_run(monkeypatch, exc):
    _raise_on(4099, exc, monkeypatch)
    with pytest.raises(type(exc)):
        run_check(CheckRequest((PYTORCH,), device="cpu", members=("token-is",), workloads=(BROKEN,)))


def test_statuses_exit_code_and_reports_of_an_internal_error():
    """Without a worker: the results layer never reads an internal error as a pass or a failure."""
    info = {"type": "KeyError", "message": "x", "where": "probe 'baseline'", "traceback": [], "report": "please report"}
    ok = WorkloadResult("a", {}, {}, "cpu", (1,), (CheckOutcome("loss", "pass", "ok"),))
    broken = WorkloadResult("b", {}, {}, "cpu", (1,), (CheckOutcome("loss", "skipped", "internal", {INTERNAL_ERROR: info}),),
                            draws={INTERNAL_ERROR: info})
    failed = WorkloadResult("c", {}, {}, "cpu", (1,), (CheckOutcome("loss", "fail", "wrong"),))
    assert internal_error(broken) == info and internal_error(broken.to_json()) == info and internal_error(ok) is None
    assert member_status([ok]) == "conformant"
    assert member_status([ok, broken]) == "skipped"  # never conformant
    assert member_status([ok, broken, failed]) == "failed"  # a genuine failure stays one


def test_junit_and_summary_name_the_internal_error(monkeypatch):
    """The JUnit case is an <error> (infrastructure, in JUnit's sense), the summary line counts it."""
    from types import SimpleNamespace

    from grpo_conform.results import CheckReport, ImplementationResult, MemberResult, Coverage

    info = {"type": "KeyError", "message": "x", "where": "probe 'baseline'", "traceback": [], "report": "r"}
    w = WorkloadResult("b", {}, {}, "cpu", (1,), (CheckOutcome("loss", "skipped", "not judged: internal error",
                                                               {INTERNAL_ERROR: info}),), draws={INTERNAL_ERROR: info})
    spec = SimpleNamespace(id="grpo/token-is", member="token-is", version="1.0.0", identity="0" * 64, source="s")
    member = MemberResult(spec, "skipped", "not judged: internal error", (w,), Coverage(("b",), (), ()))
    impl = ImplementationResult("x", "x", "0" * 64, {"spec": "grpo"}, "skipped", "m", (w,), {}, (member,))
    report = CheckReport({"kind": "cpu"}, True, (impl,), {}, "t0", "t1")
    assert report.exit_code == 3 and report.internal_errors == ["x token-is b: KeyError: x"]
    assert "1 not judged after an internal error of grpo-conform" in summary_line(report)
    cases = build_junit(report).getroot().iter("testcase")
    case = next(c for c in cases if c.get("name") == "b::loss")
    assert case.find("error") is not None and case.find("error").get("type") == "internal-error"
    # a slot's or shard's report read back and merged (--jobs, merge) keeps it: skipped, exit 3
    from grpo_conform.gate.merge import merge_implementations, pieces_from_report

    doc = json.loads(json.dumps(report.to_json()))
    (merged,) = merge_implementations(pieces_from_report(doc, "slot1"))
    assert merged.status == "skipped" and "internal error" in merged.members[0].message
    again = CheckReport({"kind": "cpu"}, True, (merged,), {}, "t0", "t1")
    assert again.exit_code == 3 and again.internal_errors == report.internal_errors


@pytest.mark.slow
def test_a_lost_cuda_context_stops_the_run_after_its_workload(monkeypatch):
    """A CUDA sticky error (torch.AcceleratorError: an illegal memory access) leaves the process's context unusable:
    the workload is an internal error and the rest of the run is not run, with the reason, instead of each later
    workload failing the same way or the worker's closing raising out of the run (H100, 2026-12-06: the float16
    zero-advantage fault ended `check` with a traceback and no report). Here judging raises it on every workload."""
    import torch

    judge = WorkloadConformance.judge

    def lost(self, *args, **kwargs):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(WorkloadConformance, "judge", lost)
    report = run_check(CheckRequest((PYTORCH,), device="cpu", members=("token-is",), workloads=(FINE, BROKEN)))
    assert report.exit_code == 3
    (impl,) = report.implementations
    (member,) = impl.members
    assert len(member.workloads) == 1 and internal_error(member.workloads[0])["type"].endswith("AcceleratorError")
    stopped = [n for n in member.coverage.not_run if "CUDA context failed" in n.reason]
    assert len(stopped) == 1, member.coverage.not_run
    monkeypatch.setattr(WorkloadConformance, "judge", judge)


def test_an_error_surfacing_at_empty_cache_keeps_the_first_report(monkeypatch):
    """conformance's closing empty_cache is where an unreported CUDA error surfaces: it becomes the workload's internal
    error with every check not failed left not judged, unless an internal error was already recorded (kept: the
    later one only says the context was already gone)."""
    from types import SimpleNamespace

    import torch

    from grpo_conform.checks.book import CheckBook

    def raising():
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "empty_cache", raising)
    first = {"type": "KeyError", "message": "x", "where": "probe 'baseline'", "traceback": [], "report": "r"}
    kept = SimpleNamespace(draws={INTERNAL_ERROR: first}, book=None)
    WorkloadConformance._empty_cache(kept)
    assert kept.draws[INTERNAL_ERROR] is first
    book = CheckBook(("loss", "gradient"))
    book.record("loss", "A", True, "ok", {})
    late = SimpleNamespace(draws={}, book=book)
    WorkloadConformance._empty_cache(late)
    assert late.draws[INTERNAL_ERROR]["type"].endswith("AcceleratorError")
    assert "no earlier call reported" in late.draws[INTERNAL_ERROR]["where"] and set(book.internal) == {"loss", "gradient"}


def test_a_call_on_an_input_set_no_step_drew_is_the_validator_s_error():
    """A slot is allocated uninitialised and `commit` records whatever it holds: zero-advantage, repeated in the
    other-dtypes pass where no baseline drew Q, edited and called an undrawn set, handing the kernel leftover GPU
    memory as token ids, and the validator's reference kernel then read out of bounds (an illegal memory access
    blamed on triton for two sessions; compute-sanitizer named reference_kernel.py, H100 2026-12-06). Only `publish`
    and a full `write` mark a set drawn; a call on one that is not raises before anything reaches the worker."""
    from types import SimpleNamespace

    import torch

    from grpo_conform.checks.buffers import InputSlot, UndrawnInputSet

    q = InputSlot("Q", {"ids": torch.zeros(3)}, {"ids": torch.zeros(3)})
    q.commit()
    assert not q.drawn
    with pytest.raises(UndrawnInputSet, match="input set Q was never drawn"):
        WorkloadConformance.forward(SimpleNamespace(), "E", q, ("zero-advantage",))
    q.write({"ids": torch.ones(3)})
    assert q.drawn
    p = InputSlot("P", {"a": torch.zeros(2), "b": torch.zeros(2)}, {"a": torch.ones(2), "b": torch.ones(2)})
    p.write({"a": torch.ones(2)})  # one input of two: still not drawn
    assert not p.drawn
    p.pristine["b"].fill_(2.0)  # the generator writes the pristine copies, then publishes them
    p.publish()
    assert p.drawn and torch.equal(p.tensors["b"], torch.full((2,), 2.0))


@pytest.mark.slow
def test_zero_advantage_draws_its_own_set_in_the_other_dtypes_pass():
    """The pass repeats zero-advantage again (it was taken out for the illegal memory access above): its calls run
    on a set drawn in the pass, in each dtype no default workload uses."""
    report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                                    members=("dapo-mask",), workloads=("mask-small-bf16",), checks=("zero-advantage",)))
    (impl,) = report.implementations
    (w,) = impl.workloads
    passes = w.draws["other_dtypes"]
    assert set(passes) == {"float16", "float32"} and all("all-zero" in p["advantage_cases"] for p in passes.values())
    assert INTERNAL_ERROR not in w.draws and report.exit_code == 0


def test_first_failure_reads_the_book_s_order_the_selection_and_never_an_informational_check():
    """What -x stops a workload on (WorkloadConformance.stop_at_failure)."""
    from grpo_conform.checks.book import CheckBook

    book = CheckBook(("runs", "loss", "gradient", "determinism"))
    book.record("determinism", "A#1", False, "not bitwise equal")  # informational: reported, never a failure
    book.record("gradient", "A#1", False, "off")
    assert book.first_failure() == "gradient" and book.first_failure(("loss",)) is None
    book.record("loss", "A#2", False, "off")
    assert book.first_failure() == "loss" and book.first_failure(("runs", "gradient")) == "gradient"
