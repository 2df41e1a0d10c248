"""The CI gate end to end, with real worker processes (kept few: every run here is one small
workload): one-timeout hangs, --fail-fast with -k, --jobs 2 equal to a serial run, and --shard 1/2 + 2/2
merged equal to the unsharded run. SIGINT/SIGTERM to `check` with nothing left behind: test_isolation_attacks
(one process per signal for both files' assertions, docs/timing.md "Eighth pass")."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from conftest import GALLERY, cli_here
from grpo_conform.check import CheckRequest, run_check

PASSING, FAILING, HANGS = GALLERY / "closed-form", GALLERY / "loss-offset", GALLERY / "hangs"  # loss-offset fails `loss` on any input
SMALL = "batch1-seq1"
pytestmark = pytest.mark.slow


def _verdicts(doc: dict) -> dict:
    """What must not depend on how the work was split: per implementation and member, the status,
    the coverage, every check reported, and the status of each check of a conformant member and of
    the root checks of a failed one. (Which secondary checks of a failed member are "not judged"
    depends on the inputs drawn, which differ from run to run.)"""
    out = {}
    for impl in doc["implementations"]:
        for m in impl["members"]:
            keep = lambda c: m["status"] == "conformant" or c["check"] in ("runs", "contract", "loss", "gradient")  # noqa
            checks = sorted((w["workload"], c["check"], c["status"] if keep(c) else "?") for w in m["workloads"]
                            for c in w["checks"])
            ran = sorted(m["coverage"]["workloads_run"])
            not_run = sorted((n["workload"], n["kind"]) for n in m["coverage"]["workloads_not_run"])
            out[(impl["name"], m["spec"]["id"])] = (impl["status"], m["status"], ran, not_run, checks)
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for i, (x, y) in enumerate(zip(a[key], b[key])):
            if x != y:
                extra = sorted(set(x) ^ set(y)) if isinstance(x, list) else (x, y)
                pytest.fail(f"{key} field {i} differs: {extra}")


def test_a_hang_costs_one_timeout():
    # --timeout 8: the bound (one timeout plus 15 s for the worker's start and the rest, as with the
    # 20 s this test used before) stays below what three timeouts alone would cost (24 s).
    started = time.monotonic()
    report = run_check(CheckRequest((str(HANGS),), device="cpu", workloads=(SMALL, "odd-vocab", "fp32-small"),
                                    timeout=8))
    elapsed = time.monotonic() - started
    assert elapsed < 8 + 15 < 3 * 8, f"a hang with --timeout 8 took {elapsed:.1f} s"
    (impl,) = report.implementations
    (member,) = impl.members
    assert impl.status == "failed" and report.exit_code == 1
    (ran,) = member.workloads
    assert ran.outcome("runs").status == "timeout"
    hung = [n for n in member.coverage.not_run if n.kind == "hung"]
    assert sorted(n.workload for n in hung) == sorted({SMALL, "odd-vocab", "fp32-small"} - {ran.workload})
    assert all("hung on token-is" in n.reason and "8 s" in n.reason for n in hung)


def test_fail_fast_stops_and_check_selection_reports_only_what_was_asked(tmp_path):
    report = run_check(CheckRequest((str(FAILING), str(PASSING)), device="cpu", workloads=(SMALL,), fail_fast=True,
                                    checks=("loss",)))
    bad, stopped = report.implementations
    assert bad.status == "failed" and report.exit_code == 1
    assert [o.check for o in bad.workloads[0].outcomes] == ["runs", "loss"]
    assert bad.members[0].coverage.checks == ("loss",)
    assert stopped.status == "skipped" and "--fail-fast" in stopped.message and not stopped.workloads
    assert [n.kind for n in stopped.members[0].coverage.not_run if n.workload == SMALL] == ["stopped"]
    assert bad.workloads[0].draws["stopped_at_failure"] == {"check": "loss", "probe": "baseline"}


def test_fail_fast_ends_a_workload_at_the_probe_where_a_check_first_fails():
    """-x stops inside the workload too: no probe after the one that failed a check runs, and every check not
    judged by then says why. Without -x the same folder runs every probe. Under -k only the selected checks
    stop it: loss-offset fails loss at baseline, and `-k gradient` runs on (its gradient is right)."""
    def run(**kw):
        report = run_check(CheckRequest((str(FAILING),), device="cpu", workloads=(SMALL,), **kw))
        (w,) = report.implementations[0].workloads
        return report, w, {o.check: o for o in w.outcomes}

    report, w, x = run(fail_fast=True)
    assert report.exit_code == 1 and x["loss"].failed and w.draws["stopped_at_failure"]["probe"] == "baseline"
    stopped = [c for c, o in x.items() if "--fail-fast stopped this workload when loss failed" in o.message]
    assert {"row-locality", "no-global-side-effects"} <= set(stopped) and all(x[c].status == "skipped" for c in stopped)
    _, w, full = run()
    assert "stopped_at_failure" not in w.draws and full["row-locality"].status == "pass"
    _, w, narrowed = run(fail_fast=True, checks=("gradient",))
    assert "stopped_at_failure" not in w.draws and narrowed["gradient"].status == "pass"


# What the two tests below are about is how the work is split (units to slots, to shards) and joined
# again, not the probes: they run the root checks only (`-k`), ~0.3 s of work per implementation
# instead of ~1 s (docs/timing.md, "Eighth pass"). Every probe on these folders: test_gallery.
CHECKS = ("loss", "gradient")
K = [arg for c in CHECKS for arg in ("-k", c)]


@pytest.fixture(scope="module")
def serial():
    """The serial run both tests below compare with, in this process (the JSON document `check --format
    json` prints is the report's to_json): a CLI subprocess cost a python, torch and a zygote more."""
    report = run_check(CheckRequest((str(PASSING), str(FAILING)), device="cpu", workloads=(SMALL,), checks=CHECKS))
    assert report.exit_code == 1, [i.message for i in report.implementations]
    return json.loads(json.dumps(report.to_json()))


def test_jobs_2_gives_the_serial_verdicts_in_parallel(serial, tmp_path):
    run = cli_here("check", PASSING, FAILING, "--device", "cpu", "--workload", SMALL, *K, "--jobs", "2", "--format",
                   "json", "--evidence-dir", tmp_path / "ev", "--junit-xml", tmp_path / "j.xml")
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    _same(_verdicts(doc), _verdicts(serial))
    assert "[cpu1]" in run.stderr and "[cpu2]" in run.stderr  # progress relayed from both slots
    parts = doc["parts"]
    assert len(parts) == 2
    (a0, a1), (b0, b1) = sorted((p["started"], p["finished"]) for p in parts)
    assert b0 <= a1, f"the slots did not overlap: {parts}"
    assert len(list((tmp_path / "ev").glob("*.intoto.json"))) == len(doc["implementations"])
    # one JUnit case per reported check (and one per member saying that the run was a -k selection)
    reported = sorted(f'{i["name"]} {w["workload"]}::{c["check"]}' for i in doc["implementations"] for m in i["members"]
                      for w in m["workloads"] for c in w["checks"])
    cases = re.findall(r'<testcase classname="grpo_conform\.([^".]+)\.[^"]*" name="([^"]+)"', (tmp_path / "j.xml").read_text())
    assert sorted(f"{impl} {name}" for impl, name in cases if name != "selection") == reported, cases
    assert len(reported) >= 2 * (1 + len(CHECKS)) and [n for _, n in cases].count("selection") == 2, cases


def test_shards_merged_equal_the_unsharded_run(serial, tmp_path):
    # each shard's `check --shard i/2` in this process, one after the other (what each shard machine runs;
    # two `python -m grpo_conform` processes beside each other cost a python, torch and a zygote each)
    for i in (1, 2):
        shard = cli_here("check", PASSING, FAILING, "--device", "cpu", "--workload", SMALL, *K, "--shard", f"{i}/2",
                         "--no-evidence", "--format", "json")
        assert "Traceback" not in shard.stderr, shard.stderr
        (tmp_path / f"shard{i}.json").write_text(shard.stdout)
    docs = [json.loads((tmp_path / f"shard{i}.json").read_text()) for i in (1, 2)]
    assert [d["shard"] for d in docs] == ["1/2", "2/2"]
    assert sorted(len(d["implementations"]) for d in docs) == [1, 1]  # two units, one per shard
    merged = cli_here("merge", tmp_path / "shard1.json", tmp_path / "shard2.json", "--format", "json",
                 "--junit-xml", tmp_path / "merged.xml")
    assert merged.returncode == serial["exit_code"] == 1, merged.stderr
    doc = json.loads(merged.stdout)
    _same(_verdicts(doc), _verdicts(serial))
    again = cli_here("merge", tmp_path / "shard1.json", tmp_path / "shard1.json")
    assert again.returncode == 2 and "duplicate" in again.stderr
    alone = cli_here("merge", tmp_path / "shard1.json")
    assert alone.returncode == 2 and "shard 2/2 missing" in alone.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)
