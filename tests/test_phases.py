"""The phase clock of a check run (grpo_conform/phases.py; docs/timing.md, "Validator time")."""

from __future__ import annotations

import time

from conftest import ROOT
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.phases import PhaseClock, add, render


def test_nested_phases_count_each_second_once():
    clock = PhaseClock()
    with clock("worker"):
        time.sleep(0.02)
        with clock("judge"):
            time.sleep(0.03)
        time.sleep(0.01)
    with clock.inclusive("probes", "baseline"):
        with clock("inputs"):
            time.sleep(0.01)
    out = clock.to_json()
    ex = out["exclusive_s"]
    assert 0.025 <= ex["worker"] < 0.1 and 0.025 <= ex["judge"] < 0.1  # judge's 30 ms not in worker's
    assert ex["worker"] < 0.03 + 0.02 + 0.02
    assert abs(sum(ex.values()) - out["wall_s"]) < 0.01  # the phases and `other` add up to the wall time
    assert out["probes_s"]["baseline"] >= 0.01 and out["counts"] == {"worker": 1, "judge": 1, "inputs": 1}
    both = add(out, out)
    assert both["exclusive_s"]["judge"] == round(2 * ex["judge"], 3) and both["wall_s"] == out["wall_s"]
    assert "judge" in render(out) and "baseline" in render(out)


def test_probe_seconds_are_also_kept_per_workload():
    """A member's first workload can cost several times its others (the fused check on the H200: 52-63 s
    at seed-b2, 5-17 s at seed-b4); the per-probe totals alone do not say which probe pays it."""
    clock = PhaseClock()
    with clock.inclusive("workloads", "impl m w1"):
        with clock.inclusive("probes", "upstream"):
            time.sleep(0.02)
    with clock.inclusive("probes", "timing"):  # outside any workload: in the totals only
        time.sleep(0.005)
    with clock.inclusive("workloads", "impl m w2"):
        with clock.inclusive("probes", "upstream"):
            time.sleep(0.005)
    pairs = clock.to_json()["probe_workloads_s"]
    assert set(pairs) == {"upstream @ impl m w1", "upstream @ impl m w2"}
    assert list(pairs)[0] == "upstream @ impl m w1" and pairs["upstream @ impl m w1"] >= 0.02
    assert clock.to_json()["probes_s"]["timing"] >= 0.005
    both = add(clock.to_json(), clock.to_json())
    assert both["probe_workloads_s"]["upstream @ impl m w2"] >= 0.01
    other = PhaseClock()
    with other.inclusive("workloads", "impl m w3"):
        with other.inclusive("probes", "baseline"):
            time.sleep(0.03)
    merged = add(clock.to_json(), other.to_json())  # slots merged: still largest first
    assert list(merged["probe_workloads_s"])[0] == "baseline @ impl m w3"
    assert "upstream @ impl m w1" in render(clock.to_json())


def test_the_json_report_carries_the_phases():
    report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu", deadline=1e-9))
    phases = report.to_json()["phases"]
    assert phases["wall_s"] >= 0 and "other" in phases["exclusive_s"]


def test_one_worker_serves_every_member():
    """Members of one implementation share its worker (check.py): one start, each member judged."""
    lines: list[str] = []
    report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                                    members=("token-offpolicy-mask", "bnpo-mask"), workloads=("mask-b1-long",)),
                       progress=lines.append)
    assert sum("starting worker" in line for line in lines) == 1, lines
    (impl,) = report.implementations
    assert [m.status for m in impl.members] == ["conformant", "conformant"]
    phases = report.phases
    assert phases["exclusive_s"]["worker"] > 0 and phases["counts"]["judge"] > 0
    assert set(phases["workloads_s"]) == {"pytorch token-offpolicy-mask mask-b1-long", "pytorch bnpo-mask mask-b1-long"}


def test_drawn_axes_are_log_uniform_and_reach_both_ends():
    from grpo_conform.check import ScaleDraw

    rng = ScaleDraw(7)
    seqs = [rng.randint(1, 80) for _ in range(4000)]
    assert min(seqs) == 1 and max(seqs) == 80
    assert 0.4 < sum(s <= 9 for s in seqs) / len(seqs) < 0.6  # 1-9 as likely as 9-80
    assert rng.randint(3, 3) == 3 and {rng.randint(1, 2) for _ in range(100)} == {1, 2}
