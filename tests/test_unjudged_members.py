"""A member with zero judged workloads never reads as conformant (issue 27 leftover: on the H200
`check --jobs 4` reported masked members "conformant" while a deadline had stopped every one of
their workloads). No worker starts here: the stops come before any workload, the slots see the
deadline at once, and the merge is fed one slot's report."""

from __future__ import annotations

import itertools

import torch

from conftest import ROOT
from grpo_conform.check import CheckRequest, RunContext, check_implementation, run_check
from grpo_conform.gate.merge import Piece, merge_implementations
from grpo_conform.gate.plan import Stop, build_plan
from grpo_conform.gate.progress import Reporter, summary_line
from grpo_conform.gate.shard import apply_units
from grpo_conform.gate.summary import build_summary
from grpo_conform.results import CheckOutcome, WorkloadResult, member_status

CPU = torch.device("cpu")
PYTORCH = str(ROOT / "implementations" / "pytorch")  # declares every member of the family


def _no_member_conformant(report) -> None:
    for impl in report.implementations:
        assert impl.status != "conformant", impl.message
        for m in impl.members:
            judged = [w for w in m.workloads if any(o.status == "pass" and o.check != "tamper-scan" for o in w.outcomes)]
            if not judged:
                assert m.status != "conformant", (m.member, m.message)
                assert m.to_json()["status"] != "conformant"
    assert report.exit_code != 0
    assert "conformant" not in summary_line(report)
    assert "✅" not in build_summary(report)


def test_a_stop_between_member_and_workload_leaves_the_member_not_judged():
    """The deadline passes after a member started and before its first workload: no workload ran, so
    the member is skipped (it read `conformant on the checked workloads (0 of 8)` before)."""
    plan = build_plan(CheckRequest((PYTORCH,), device="cpu"), CPU)
    (p,) = plan.implementations
    ticks = itertools.count()
    stop = Stop(deadline=2, clock=lambda: next(ticks))  # passes at the 3rd look: the first workload's
    result = check_implementation(p, RunContext(CPU, None), CheckRequest((PYTORCH,), device="cpu"), Reporter(), stop)
    first = result.members[0]
    assert not first.workloads and first.status == "skipped", first.message
    assert first.message.startswith("not judged") and "--deadline" in first.message
    assert all(m.status != "conformant" for m in result.members) and result.status == "skipped"


def test_deadline_with_jobs_on_a_many_member_implementation():
    """--jobs 2 with a deadline already passed: every single-workload job is reported stopped and the
    pieces merge (several stopped pieces of one implementation were refused as duplicate skips when
    it had more than one member), with no member conformant and exit 3."""
    report = run_check(CheckRequest((PYTORCH,), device="cpu", deadline=1e-9, jobs=2))
    (impl,) = report.implementations
    declared = build_plan(CheckRequest((PYTORCH,), device="cpu"), CPU).implementations[0].members
    assert len(impl.members) == len(declared) > 1 and all(m.status == "skipped" and not m.workloads for m in impl.members)
    _no_member_conformant(report)
    assert report.exit_code == 3


def test_a_slot_report_whose_member_ran_elsewhere_is_not_conformant():
    """A slot's job holds one workload of one member; the others are `elsewhere` in its report. Merged
    alone (the pieces that held them are missing), those members must not become conformant."""
    plan = build_plan(CheckRequest((PYTORCH,), device="cpu"), CPU)
    (p,) = plan.implementations
    unit = p.units()[0]
    mine = apply_units(plan, {unit}, "run in another slot").implementations[0]
    ws = WorkloadResult(unit[2], {"batch": 1}, {}, "cpu", (1, 2),
                        (CheckOutcome("runs", "pass", "every call returned"), CheckOutcome("tamper-scan", "pass", "ok")))
    # The slot's own result for its job, as check_implementation builds it (the unit's workload judged).
    from grpo_conform.check import _member, _result

    members = [_member(m, "", "", (ws,) if m.label == unit[1] else ()) for m in mine.members]
    piece = _result(mine, members, {})
    assert [m.status for m in piece.members].count("conformant") == 1
    (merged,) = merge_implementations([Piece("slot1", {}, piece)])
    statuses = {m.member: m.status for m in merged.members}
    assert statuses.pop(unit[1]) == "conformant"
    assert set(statuses.values()) == {"skipped"} and merged.status == "skipped"


def test_a_workload_whose_every_check_was_skipped_judges_nothing():
    only_static = WorkloadResult("w", {}, {}, "cpu", (1, 2), (
        CheckOutcome("runs", "skipped", "not run: the worker was lost"), CheckOutcome("tamper-scan", "pass", "ok")))
    assert member_status((only_static,)) == "skipped"
    assert member_status(()) == "skipped"
    passed = WorkloadResult("w", {}, {}, "cpu", (1, 2), (CheckOutcome("runs", "pass", "every call returned"),))
    assert member_status((only_static, passed)) == "conformant"
