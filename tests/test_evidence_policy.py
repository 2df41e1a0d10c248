"""verify --policy and its flags; coverage (k of n workloads); the builder id."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from conftest import cli_here
from grpo_conform.evidence import Policy, PolicyError, builder_identity, load_policy
from test_evidence_support import (
    make_project,
    make_trust_root,
    new_key,
    outcome,
    signed_record,
    statement_for,
    verify,
)


@pytest.fixture()
def env(tmp_path):
    project = make_project(tmp_path / "proj")
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    path = signed_record(project / "evidence" / "r.intoto.json", statement_for(project), key)
    return project, key, trust, path


def _policy_message(report) -> str:
    step = report.files[0].step("policy")
    return " | ".join((step.status, step.message, *step.notes))


@pytest.mark.parametrize("policy, ok, message", [
    (Policy(require_result=("PASSED",)), True, "meets the policy"),
    (Policy(require_verdict=("failed",)), False, "verdict conformant, the policy requires failed"),
    (Policy(spec_id="grpo-token-is", spec_version=">=1.0.0,<2.0.0"), True, "meets"),
    (Policy(spec_version=">=1.1.0"), False, "spec version 1.0.0 is outside >=1.1.0"),
    (Policy(spec_version=">=1.0.0,<2"), True, "meets"),  # docs/evidence.md's example: "<2" is "<2.0.0"
    (Policy(spec_version=">=1,<1.0.1"), True, "meets"),
    (Policy(spec_version="<1"), False, "spec version 1.0.0 is outside <1"),
    (Policy(spec_id="grpo/token-is"), False, "spec grpo-token-is, the policy expects grpo/token-is"),
    (Policy(hardware="H200"), False, "hardware 'x86_64' (self-reported), the policy expects 'H200'"),
    (Policy(hardware="x86"), True, "meets"),
    (Policy(max_age="1d"), True, "meets"),
    (Policy(max_age="1h"), False, "older than 1h"),
    (Policy(builder="https://github.com/"), False, "does not start with"),
])
def test_policy_rules(env, policy, ok, message) -> None:
    _, _, trust, path = env
    report = verify(path, trust, policy=policy)
    assert report.files[0].ok is ok
    assert message in _policy_message(report)
    if ok:
        assert report.lines()[1].startswith("OK")


def test_allowed_signers_per_implementation(env) -> None:
    _, key, trust, path = env
    other = new_key()
    assert verify(path, trust, policy=Policy(signers={"pytorch": (key.keyid,)})).files[0].ok
    assert verify(path, trust, policy=Policy(signers={"*": (f"owner-{key.keyid[:6]}",)})).files[0].ok
    report = verify(path, trust, policy=Policy(signers={"pytorch": (other.keyid,)}))
    assert not report.files[0].ok and "the policy allows only" in _policy_message(report)
    assert verify(path, trust, policy=Policy(signers={"triton": (other.keyid,)})).files[0].ok  # not for pytorch


def test_coverage_k_of_n_and_full_coverage_policy(tmp_path) -> None:
    project = make_project(tmp_path / "proj")
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    st = statement_for(project)  # one seed workload of the spec's ten ran
    cov = st["predicate"]["coverage"]
    assert cov["checked"] == 1 and cov["total"] > 1 and cov["complete"] is False
    assert st["predicate"]["summary"] == f"conformant on the checked workloads (1 of {cov['total']})"
    assert all(w["reason"] for w in cov["workloads_not_run"])
    path = signed_record(project / "evidence" / "r.json", st, key)
    report = verify(path, trust)
    assert report.files[0].ok and f"on the checked workloads (1 of {cov['total']})" in "\n".join(report.lines())
    strict = verify(path, trust, policy=Policy(require_full_coverage=True))
    assert not strict.files[0].ok and f"covers 1 of {cov['total']} workloads" in _policy_message(strict)


def test_member_coverage_is_taken_from_the_member_result(tmp_path, monkeypatch) -> None:
    """A MemberResult (issue 13) with its own coverage makes the record of that member."""
    from grpo_conform.evidence import build_statement
    from test_evidence_support import synthetic_impl, synthetic_report

    project = make_project(tmp_path / "proj")
    monkeypatch.chdir(project)
    impl = synthetic_impl(project / "implementations" / "pytorch")
    report = synthetic_report(project, impl)
    spec = next(iter(report.specs.values()))
    member = SimpleNamespace(spec=spec, status="conformant", message="ok", workloads=impl.workloads,
                             coverage={"not_run": [{"workload": "seed-b4", "reason": "--workload seed-b2"}]})
    st = build_statement(report, impl, member)
    cov = dict(st["predicate"]["coverage"])
    assert cov.pop("exercised")["shapes"] and cov.pop("declared")["defaults"]  # issue 27: what the calls exercised
    assert cov == {"workloads_run": ["seed-b2"], "checked": 1, "total": 2, "complete": False,
                                           "checks_selected": [],
                                           "workloads_not_run": [{"workload": "seed-b4",
                                                                  "reason": "--workload seed-b2"}]}


def test_policy_file_json_and_toml(tmp_path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({"require_result": ["PASSED"], "hardware": "H200"}))
    (tmp_path / "p.toml").write_text('require_result = ["PASSED"]\nmax_age = "30d"\n[signers]\ntriton = ["k"]\n')
    assert load_policy(tmp_path / "p.json").hardware == "H200"
    assert load_policy(tmp_path / "p.toml").signers == {"triton": ("k",)}
    (tmp_path / "typo.json").write_text(json.dumps({"require_reslut": ["PASSED"]}))
    with pytest.raises(PolicyError, match="require_reslut"):
        load_policy(tmp_path / "typo.json")
    # every comparator is parsed, even after one that fails for 0.0.0 (a typo was judged per file, as an envelope failure)
    with pytest.raises(PolicyError, match="'<2x': expected comparators"):
        Policy().merged(spec_version=">=1.0.0,<2x")
    (tmp_path / "age.json").write_text(json.dumps({"max_age": "soon"}))
    with pytest.raises(PolicyError, match="max_age"):
        load_policy(tmp_path / "age.json")


def test_cli_flags_override_the_policy_file(env, tmp_path) -> None:
    project, _, trust, path = env
    (tmp_path / "p.json").write_text(json.dumps({"require_result": ["FAILED"]}))
    base = ["verify", path, "--trust-root", str(trust.folder), "--policy", str(tmp_path / "p.json"),
            "--project", str(project)]
    done = cli_here(*base, cwd=os.getcwd())  # in this process (conftest.cli_here)
    assert done.returncode == 1 and "result PASSED, the policy requires FAILED" in done.stdout
    done = cli_here(*base, "--require-result", "PASSED", "--expect-subject", "implementations/pytorch", cwd=os.getcwd())
    assert done.returncode == 0, done.stdout
    assert "\nOK " in "\n" + done.stdout.split("\n", 1)[1]


def test_builder_identity_from_the_environment() -> None:
    assert builder_identity({"GRPO_CONFORM_BUILDER_ID": "lab-h200-3"}) == {"id": "lab-h200-3",
                                                                           "source": "GRPO_CONFORM_BUILDER_ID"}
    gh = builder_identity({"GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "2",
                           "GITHUB_REPOSITORY": "o/r", "GITHUB_SERVER_URL": "https://github.com"})
    assert gh["id"] == "https://github.com/o/r/actions/runs/42/attempts/2" and gh["source"] == "github-actions"
    assert builder_identity({})["source"] == "hostname (self-reported)"


def test_builder_is_recorded_and_shown(env, monkeypatch) -> None:
    project, key, trust, _ = env
    monkeypatch.setenv("GRPO_CONFORM_BUILDER_ID", "ci://runner-7")
    path = signed_record(project / "evidence" / "b.json", statement_for(project), key)
    report = verify(path, trust, policy=Policy(builder="ci://"))
    assert report.files[0].ok and "builder ci://runner-7" in "\n".join(report.lines())


def test_failed_outcomes_make_a_failed_record(env) -> None:
    project, key, trust, _ = env
    st = statement_for(project, status="failed", outcomes=(outcome("loss", "fail"), outcome("gradient", "pass")))
    assert st["predicate"]["result"] == "FAILED" and st["predicate"]["failedTests"] == ["seed-b2/loss"]
    path = signed_record(project / "evidence" / "f.json", st, key)
    assert verify(path, trust).files[0].ok
    assert not verify(path, trust, policy=Policy(require_result=("PASSED", "WARNED"))).files[0].ok


def test_members_not_run_are_named_and_full_coverage_refuses_them(tmp_path, monkeypatch) -> None:
    import dataclasses

    from grpo_conform.evidence import build_statement
    from test_evidence_support import synthetic_impl, synthetic_report

    project = make_project(tmp_path / "proj")
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    monkeypatch.chdir(project)
    impl = synthetic_impl(project / "implementations" / "pytorch")
    report = synthetic_report(project, impl)
    seed = next(iter(report.specs.values()))
    spec = SimpleNamespace(id="grpo/token-is", version="1.0.0", identity=seed.identity, source=seed.source,
                           workloads=(), member="token-is", family="grpo@1.0.0")
    member = SimpleNamespace(spec=spec, status="conformant", message="ok", workloads=impl.workloads,
                             coverage={"not_run": []})
    impl = dataclasses.replace(impl, manifest={**impl.manifest, "members": ["token-is", "dapo-mask"]},
                               members=(member,))
    st = build_statement(report, impl, member)
    cov = st["predicate"]["coverage"]
    assert cov["complete"] and cov["members_run"] == ["token-is"]
    assert [m["member"] for m in cov["members_not_run"]] == ["dapo-mask"]
    path = signed_record(project / "evidence" / "m.json", st, key)
    report = verify(path, trust, allow_unverified=True)  # the member identity needs the real family file
    assert "1 member(s) not run: dapo-mask" in "\n".join(report.lines())
    strict = verify(path, trust, allow_unverified=True, policy=Policy(require_full_coverage=True))
    assert "member(s) of the implementation were not run (dapo-mask)" in _policy_message(strict)
