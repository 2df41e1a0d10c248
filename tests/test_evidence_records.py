"""Writing records atomically, and signing records afterwards without touching their payload."""

from __future__ import annotations

import json
import os

import pytest

from grpo_conform.evidence import (
    ENV_SIGNING_KEY_FILE,
    RecordError,
    SignRequest,
    SigningKeyError,
    VerifyRequest,
    keygen,
    run_sign,
    run_verify,
    sign_record,
    write_evidence,
    write_record,
)
from grpo_conform.evidence import records
from test_evidence_support import make_project, new_key, signed_record, statement_for, synthetic_impl, synthetic_report
from test_evidence_support import trust_list as trust


@pytest.fixture()
def proj(tmp_path):
    """A throw-away project; records are written inside it so their identities are recomputable."""
    return make_project(tmp_path / "proj")


def _payload(path) -> str:
    return json.loads(open(path).read())["payload"]


def test_write_record_signed_and_unsigned(tmp_path, proj) -> None:
    key = new_key()
    signed = write_record(statement_for(proj), tmp_path / "s.json", key)
    unsigned = write_record(statement_for(proj), tmp_path / "u.json", None)
    assert signed.signed and signed.keyids == (key.keyid,) and not unsigned.signed
    assert signed.record_identity == unsigned.record_identity  # same statement, same payload bytes
    assert signed.to_json()["signed"] is True and unsigned.to_json()["signed"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj", "s.json", "u.json"]  # no temporary files left
    raw = write_record(statement_for(proj), tmp_path / "raw.json", key.private_key)  # a bare cryptography key
    assert raw.keyids == (key.keyid,)


def test_write_is_atomic(tmp_path, proj, monkeypatch) -> None:
    target = tmp_path / "r.json"
    target.write_text("previous record")

    def fail(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.os, "replace", fail)
    with pytest.raises(RecordError, match="cannot write the record: No space left on device"):
        write_record(statement_for(proj), target, None)
    assert target.read_text() == "previous record"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj", "r.json"]


def test_write_evidence_writes_one_record_per_implementation(tmp_path, proj, monkeypatch) -> None:
    monkeypatch.chdir(proj)
    impl = synthetic_impl(proj / "implementations" / "pytorch")
    written = write_evidence(synthetic_report(proj, impl), tmp_path / "h200", None)
    (name,) = [os.path.basename(w.path) for w in written]
    assert name.startswith("pytorch--") and name.endswith(".intoto.json")  # implementation--device--time
    assert written[0].result == "PASSED" and written[0].verdict == "conformant" and not written[0].signed


def test_sign_record_adds_a_signature_and_keeps_the_payload(tmp_path, proj) -> None:
    path = tmp_path / "r.json"
    write_record(statement_for(proj), path, None)
    before = _payload(path)
    first, second = new_key(), new_key()
    out = sign_record(path, first)
    assert out.signed and _payload(path) == before
    mtime = path.stat().st_mtime_ns
    assert sign_record(path, first).keyids == (first.keyid,)  # signing twice with one key changes nothing
    assert path.stat().st_mtime_ns == mtime
    assert sign_record(path, second).keyids == (first.keyid, second.keyid) and _payload(path) == before
    only_second = trust(tmp_path, (second, {}))
    assert run_verify(VerifyRequest((str(path),), only_second, project=str(proj))).exit_code == 0


def test_sign_refuses_broken_records(tmp_path, proj) -> None:
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(RecordError, match="junk.json: not a grpo-conform record: missing field"):
        sign_record(tmp_path / "junk.json", new_key())
    st = statement_for(proj)
    st["predicate"]["result"] = "FINE"
    signed_record(proj / "bad.json", st, None)
    keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    with pytest.raises(RecordError, match="refusing to sign: schema fail: .*predicate.result"):
        run_sign(SignRequest((str(proj / "bad.json"),), str(tmp_path / "k.pem")))
    with pytest.raises(RecordError, match="no such record file"):
        sign_record(tmp_path / "absent.json", new_key())


def test_run_sign(tmp_path, proj) -> None:
    keyid = keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    a, b = proj / "a.json", proj / "b.json"
    write_record(statement_for(proj), a, None)
    write_record(statement_for(proj), b, None)
    report = run_sign(SignRequest((str(a), str(b)), str(tmp_path / "k.pem"), project=str(proj)))
    assert report.keyid == keyid and report.exit_code == 0 and all(r.signed for r in report.records)
    assert json.dumps(report.to_json())


def test_run_sign_reads_the_environment(tmp_path, proj, monkeypatch) -> None:
    keyid = keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    write_record(statement_for(proj), proj / "a.json", None)
    monkeypatch.delenv("GRPO_CONFORM_SIGNING_KEY", raising=False)
    monkeypatch.setenv(ENV_SIGNING_KEY_FILE, str(tmp_path / "k.pem"))
    report = run_sign(SignRequest((str(proj / "a.json"),), project=str(proj)))
    assert report.keyid == keyid and ENV_SIGNING_KEY_FILE in report.key_source


def test_run_sign_without_a_key_or_with_a_bad_file_signs_nothing(tmp_path, proj, monkeypatch) -> None:
    monkeypatch.delenv("GRPO_CONFORM_SIGNING_KEY", raising=False)
    monkeypatch.delenv(ENV_SIGNING_KEY_FILE, raising=False)
    write_record(statement_for(proj), proj / "a.json", None)
    with pytest.raises(SigningKeyError, match="no signing key: pass --key FILE, or set GRPO_CONFORM_SIGNING_KEY"):
        run_sign(SignRequest((str(proj / "a.json"),)))
    keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    (proj / "b.json").write_text("nope")
    with pytest.raises(RecordError):
        run_sign(SignRequest((str(proj / "a.json"), str(proj / "b.json")), str(tmp_path / "k.pem")))
    assert json.loads((proj / "a.json").read_text())["signatures"] == []


def test_write_evidence_writes_one_record_per_member(tmp_path, proj, monkeypatch) -> None:
    """Decision member-results (docs/decisions.md): an ImplementationResult with members gives one record per member."""
    monkeypatch.chdir(proj)
    impl = synthetic_impl(proj / "implementations" / "pytorch")
    report = synthetic_report(proj, impl)
    report = _with_members(report, impl, next(iter(report.specs.values())), {"a": "ran", "b": "ran"})
    written = write_evidence(report, tmp_path / "out", None)
    names = sorted(os.path.basename(w.path) for w in written)
    assert [n.split("--")[:2] for n in names] == [["pytorch", "a"], ["pytorch", "b"]]


def _with_members(report, impl, spec, plan):
    """`report` whose one implementation has members named by `plan`: {member: workloads or 'elsewhere'}."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from grpo_conform.results import Coverage, NotRun

    @dataclass(frozen=True)
    class WithMembers:
        base: object
        members: tuple

        def __getattr__(self, name):
            return getattr(self.base, name)

    members = []
    for m, how in plan.items():
        ran = how != "elsewhere"
        cov = Coverage((), (NotRun("w", "run in another slot", "elsewhere"),
                            NotRun("x", "not selected (--workload)", "deselected"))) if not ran else Coverage()
        members.append(SimpleNamespace(spec=SimpleNamespace(**{k: getattr(spec, k) for k in (
            "id", "version", "identity", "source", "workloads")}, member=m, family="grpo-token-is"),
            status="conformant", message=m, workloads=impl.workloads if ran else (), coverage=cov))
    return type(report)(report.device, report.interpreter, (WithMembers(impl, tuple(members)),), report.specs,
                        report.started, report.finished, report.software, report.hardware)


def test_write_evidence_of_slot_parts(tmp_path, proj, monkeypatch) -> None:
    """--jobs with more slots than implementations runs single workloads per slot: each slot report names
    every selected member, most of them run elsewhere. Those get no record (a record of them would say
    'conformant' on no check, which `verify` refuses: the H200 run of 2026-12-02 lost every record of
    its step that way); two slots' records of one member finished in the same second both survive."""
    from types import SimpleNamespace

    monkeypatch.chdir(proj)
    impl = synthetic_impl(proj / "implementations" / "pytorch")
    base = synthetic_report(proj, impl)
    spec = next(iter(base.specs.values()))
    one = _with_members(base, impl, spec, {"a": "ran", "b": "elsewhere"})
    two = _with_members(base, impl, spec, {"a": "ran", "b": "ran"})
    written = write_evidence(SimpleNamespace(parts=(one, two)), tmp_path / "out", None)
    names = sorted(os.path.basename(w.path) for w in written)
    stamp = names[0].split("--")[3]
    assert [n.split("--")[1] for n in names] == ["a", "a", "b"]
    assert any(n.endswith("-2.intoto.json") for n in names) and len(set(names)) == 3
    assert all(n.split("--")[3] == stamp for n in names)  # same second: told apart by the suffix
    assert records.decided_elsewhere(one.implementations[0].members[1])
    assert not records.decided_elsewhere(one.implementations[0].members[0])


def test_write_evidence_of_parts_is_all_or_nothing(tmp_path, proj, monkeypatch) -> None:
    """A statement that `verify` would refuse in any slot's part stops the run before any record is written."""
    from dataclasses import replace as dc_replace
    from types import SimpleNamespace

    monkeypatch.chdir(proj)
    impl = synthetic_impl(proj / "implementations" / "pytorch")
    base = synthetic_report(proj, impl)
    spec = next(iter(base.specs.values()))
    good = _with_members(base, impl, spec, {"a": "ran"})
    bad = _with_members(base, dc_replace(impl, workloads=()), spec, {"b": "ran"})  # conformant on no check
    with pytest.raises(records.StatementError, match="no check passed"):
        write_evidence(SimpleNamespace(parts=(good, bad)), tmp_path / "out", None)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
