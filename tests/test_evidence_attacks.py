"""Every attack of issue 12 as a record that verify must refuse (and sign must refuse to sign).

Each test builds the forged record in a throw-away project, signs it with a key the throw-away
trust root trusts (so the signature is never what stops it), and checks the named step fails.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_conform.errors import EXIT_FAILED
from grpo_conform.evidence import RecordError, SignRequest, StatementError, run_sign, write_record
from grpo_conform.evidence.dsse import make_envelope
from grpo_conform.evidence.statement import PROJECT_ROOT, statement_bytes
from test_evidence_support import (
    identity_of,
    make_project,
    make_trust_root,
    new_key,
    signed_record,
    statement_for,
    verify,
)


@pytest.fixture()
def env(tmp_path):
    project = make_project(tmp_path / "proj", ("pytorch", "triton", "liger"))
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    return project, key, trust


def _forge(env, name: str, change=None, statement=None) -> str:
    project, key, _ = env
    st = statement or statement_for(project)
    if change:
        change(st)
    return signed_record(project / "evidence" / f"{name}.intoto.json", st, key)


def _first_failure(f) -> tuple[str, str]:
    bad = next(s for s in f.steps if not s.ok)
    return bad.step, bad.message


def _sign_refuses(env, path: str, match: str) -> None:
    project, _, _ = env
    pem = project.parent / "k.pem"
    if not pem.exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        pem.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    before = Path(path).read_bytes()
    with pytest.raises(RecordError, match=match):
        run_sign(SignRequest((path,), str(pem)))
    assert Path(path).read_bytes() == before


def _thirty_failures(st):
    w = st["predicate"]["workloads"][0]
    w["checks"] = [{"check": f"c{i}", "status": "fail", "message": "x", "evidence": {}} for i in range(30)]


# -- verdict not tied to the checks ---------------------------------------------------------
def test_conformant_verdict_over_30_failing_checks(env) -> None:
    path = _forge(env, "lie", _thirty_failures)
    f = verify(path, env[2]).files[0]
    step, _ = _first_failure(f)
    assert (step, f.ok) == ("semantics", False)
    said = " ".join((f.step("semantics").message, *f.step("semantics").notes))
    assert "failedTests lists 0 test(s) but the checks give 30" in said
    _sign_refuses(env, path, "semantics")


def test_write_record_refuses_a_lying_statement(env, tmp_path) -> None:
    st = statement_for(env[0])
    _thirty_failures(st)
    with pytest.raises(StatementError, match="contradicts itself"):
        write_record(st, tmp_path / "x.json", None)


@pytest.mark.parametrize("change, message", [
    (lambda st: st["predicate"].update(result="PASSED", verdict="failed"), "'FAILED' was expected"),
    (lambda st: st["predicate"]["passedTests"].append("seed-b2/gradient"), "passedTests"),
    (lambda st: st["predicate"].update(result="WARNED"), "'PASSED' was expected"),
    (lambda st: st["predicate"].update(verdict="failed", result="FAILED"), "verdict 'failed' but no check failed"),
    (lambda st: st["predicate"]["coverage"].update(total=99), "coverage says 1 of 99"),
])
def test_other_self_contradictions(env, change, message) -> None:
    path = _forge(env, "lie", change)
    f = verify(path, env[2]).files[0]
    assert not f.ok
    assert any(message in s.message or any(message in n for n in s.notes) for s in f.steps)


# -- subject binding ------------------------------------------------------------------------
def test_second_subject_is_refused(env) -> None:
    def two(st):
        st["subject"].append({"name": "implementations/triton",
                              "digest": {"dirHash": identity_of(env[0] / "implementations" / "triton")}})
    path = _forge(env, "two", two)
    f = verify(path, env[2]).files[0]
    assert not f.ok and "subject" in _first_failure(f)[1]
    _sign_refuses(env, path, "subject")


def test_liger_digest_under_tritons_name(env) -> None:
    project = env[0]
    liger = identity_of(project / "implementations" / "liger")
    st = statement_for(project, "triton")
    st["subject"][0]["digest"]["dirHash"] = liger
    st["predicate"]["implementation"]["identity"] = liger
    st["predicate"]["configuration"][1]["digest"]["dirHash"] = liger
    path = _forge(env, "swap", statement=st)
    f = verify(path, env[2]).files[0]
    step, message = _first_failure(f)
    assert step == "identities" and "implementations/triton" in message and "recomputed" in message
    _sign_refuses(env, path, "identities")


def test_subject_name_not_the_implementation_path(env) -> None:
    path = _forge(env, "n", lambda st: st["subject"][0].update(name="implementations/triton"))
    assert _first_failure(verify(path, env[2]).files[0])[0] == "semantics"


def test_expected_subject_policy(env) -> None:
    from grpo_conform.evidence import Policy

    path = _forge(env, "ok")
    assert verify(path, env[2], policy=Policy(subject_path="implementations/pytorch")).files[0].ok
    f = verify(path, env[2], policy=Policy(subject_path="implementations/triton")).files[0]
    assert _first_failure(f) == ("policy", "subject is 'implementations/pytorch', the policy expects "
                                           "'implementations/triton'")
    wrong = identity_of(env[0] / "implementations" / "liger")
    assert not verify(path, env[2], policy=Policy(subject_digest=wrong)).files[0].ok


# -- not recomputed is not a pass -----------------------------------------------------------
def test_fake_path_and_spec_are_unverified(env) -> None:
    def fake(st):
        p = st["predicate"]
        for where in (st["subject"][0], ):
            where["name"] = "implementations/nowhere"
        p["implementation"]["path"] = "implementations/nowhere"
        p["configuration"][1]["uri"] = "implementations/nowhere"
        p["configuration"][0]["uri"] = "specs/nothing.json"
    path = _forge(env, "fake", fake)
    report = verify(path, env[2])
    f = report.files[0]
    assert f.step("identities").status == "unverified" and report.exit_code == EXIT_FAILED
    assert "UNVERIFIED" in f.step("identities").message
    accepted = verify(path, env[2], allow_unverified=True)
    assert accepted.exit_code == 0 and accepted.files[0].status == "unverified"
    assert "UNVERIFIED" in "\n".join(accepted.lines())


def test_outside_a_checkout_nothing_is_consistent_with_this_tree(env, tmp_path, monkeypatch) -> None:
    path = _forge(env, "ok")
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    copy_ = lonely / "r.intoto.json"
    copy_.write_bytes(Path(path).read_bytes())
    monkeypatch.chdir(lonely)
    f = verify(str(copy_), env[2]).files[0]
    assert f.step("identities").status == "unverified"
    assert "this tree" not in " ".join(f.step("identities").notes)
    assert verify(str(copy_), env[2], project=str(env[0])).files[0].ok


# -- canonical form, strict parsing -----------------------------------------------------------
def test_indented_payload_is_refused(env) -> None:
    project, key, trust = env
    st = statement_for(project)
    payload = json.dumps(st, indent=2, sort_keys=True).encode()
    path = signed_record(project / "evidence" / "ind.json", payload, key)
    step, message = _first_failure(verify(path, trust).files[0])
    assert step == "semantics" and "RFC 8785" in message
    _sign_refuses(env, path, "RFC 8785")


def test_python_encoded_payload_is_refused(env) -> None:
    """Compact and sorted, as Python's own encoder writes it: the form the verifier's shortcut re-encodes with
    (canonical.is_canonical_fast). It differs from RFC 8785 only in a float ("1e-07" against "1e-7")."""
    project, key, trust = env
    st = statement_for(project)
    payload = json.dumps(st, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert payload != statement_bytes(st) and b"1e-07" in payload
    path = signed_record(project / "evidence" / "py.json", payload, key)
    step, message = _first_failure(verify(path, trust).files[0])
    assert step == "semantics" and "RFC 8785" in message


def test_huge_integer_is_refused(env) -> None:
    project, key, trust = env
    st = statement_for(project)
    text = statement_bytes(st).replace(b'"reps":50', b'"reps":1000000000000000000000000000000')
    assert b"1000000000000000000000000000000" in text
    path = signed_record(project / "evidence" / "big.json", text, key)
    step, message = _first_failure(verify(path, trust).files[0])
    assert step == "semantics" and "RFC 8785" in message


def test_envelope_with_two_payload_keys_is_refused(env) -> None:
    project, key, trust = env
    good = make_envelope(statement_bytes(statement_for(project)), key).to_json()
    text = json.dumps(good)[:-1] + ', "payload": "e30="}'
    path = project / "evidence" / "dup.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    step, message = _first_failure(verify(str(path), trust).files[0])
    assert step == "envelope" and "duplicate key 'payload'" in message


def test_payload_with_duplicate_keys_is_refused(env) -> None:
    project, key, trust = env
    text = statement_bytes(statement_for(project))
    text = text[:-1] + b',"predicateType":"x"}'
    path = signed_record(project / "evidence" / "dupp.json", text, key)
    step, message = _first_failure(verify(path, trust).files[0])
    assert step == "schema" and "duplicate key" in message


# -- hostile paths --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["../../etc", "/etc", "implementations/../../../etc", "a\\b", ""])
def test_paths_outside_the_project_are_refused_and_never_read(env, bad, monkeypatch) -> None:
    def move(st):
        st["subject"][0]["name"] = bad
        st["predicate"]["implementation"]["path"] = bad
        st["predicate"]["configuration"][1]["uri"] = bad
    walked = []
    import grpo_conform.evidence.identities as ids

    monkeypatch.setattr(ids, "folder_listing", lambda folder: walked.append(folder) or "")
    path = _forge(env, "walk", move)
    f = verify(path, env[2]).files[0]
    assert not f.ok and f.step("identities").status in ("skipped", "unverified")
    assert walked == []


def test_v1_record_with_an_absolute_path_is_refused_by_semantics(env) -> None:
    """v1's schema allows any path; the shared semantic check does not."""
    project, key, trust = env
    def statement(path):
        return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))

    # a v1 record (the 2026-11-30 run), chosen by its predicate type: glob order is the file system's
    records = sorted((PROJECT_ROOT / "evidence" / "h200").glob("pytorch--*.json"))
    st = next(s for s in map(statement, records) if s["predicateType"].endswith("/check-result/v1"))
    st["subject"][0]["name"] = st["predicate"]["implementation"]["path"] = "/etc"
    st["predicate"]["configuration"][1]["uri"] = "/etc"
    path = signed_record(project / "evidence" / "v1.json", st, key)
    step, message = _first_failure(verify(path, trust).files[0])
    assert step == "semantics" and "/etc" in message


def test_symbolic_link_out_of_the_project_is_not_followed(env, tmp_path) -> None:
    project = env[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_text("x")
    (project / "implementations" / "evil").symlink_to(outside)
    def move(st):
        st["subject"][0]["name"] = st["predicate"]["implementation"]["path"] = "implementations/evil"
        st["predicate"]["configuration"][1]["uri"] = "implementations/evil"
    f = verify(_forge(env, "link", move), env[2]).files[0]
    assert f.step("identities").status == "unverified" and "outside" in f.step("identities").message


# -- a FAILED record never prints OK under a policy requiring a pass --------------------------------
def test_failed_record_is_not_ok(env) -> None:
    from grpo_conform.evidence import Policy

    def failing(st):
        w = st["predicate"]["workloads"][0]
        w["checks"][0]["status"] = "fail"
        st["predicate"].update(verdict="failed", result="FAILED", summary="failed",
                               passedTests=["seed-b2/no-aliasing", "seed-b2/determinism"],
                               failedTests=["seed-b2/loss"])
    path = _forge(env, "failed", failing)
    plain = verify(path, env[2])
    text = "\n".join(plain.lines())
    assert plain.exit_code == 0 and "AUTHENTIC" in text and "result     FAILED" in text
    assert not any(line.startswith("OK ") for line in plain.lines())
    strict = verify(path, env[2], policy=Policy(require_result=("PASSED",)))
    assert strict.exit_code == EXIT_FAILED
    assert strict.lines()[1].startswith("FAIL")
    assert "result FAILED, the policy requires PASSED" in "\n".join(strict.lines())


# -- signing refuses what verify refuses and shows what it signs --------------------------------------
def test_sign_shows_subject_result_verdict_hardware(env) -> None:
    project, _, trust = env
    path = signed_record(project / "evidence" / "u.json", statement_for(project), None)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = project.parent / "s.pem"
    pem.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    report = run_sign(SignRequest((path,), str(pem), dry_run=True, project=str(project)))
    text = "\n".join(report.lines())
    for needle in ("would sign", "subject    implementations/pytorch", "result     PASSED  verdict conformant",
                   "hardware   x86_64 (self-reported)", "NOT named by the shipped trust root"):
        assert needle in text, text
    assert json.loads(Path(path).read_text())["signatures"] == []  # dry run
    report = run_sign(SignRequest((path,), str(pem), project=str(project)))
    assert len(json.loads(Path(path).read_text())["signatures"]) == 1


def test_sign_refuses_unverified_identities_unless_told(env, tmp_path) -> None:
    project = env[0]
    st = statement_for(project)
    path = signed_record(project / "evidence" / "u.json", st, None)
    (project / "implementations" / "pytorch" / "impl.py").write_text("# changed after the run\n")
    _sign_refuses(env, path, "identities")


def test_cli_verify_prints_json_even_when_it_cannot_start(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "grpo_conform", "verify", "nothing.json", "--format", "json",
                           "--trust-root", str(tmp_path / "none")], capture_output=True, text=True, cwd=tmp_path)
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and "no trust root here" in doc["error"] and done.returncode == 2
