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
from test_evidence_support import new_key, signed_record, synthetic_report, synthetic_statement, trust


def _payload(path) -> str:
    return json.loads(open(path).read())["payload"]


def test_write_record_signed_and_unsigned(tmp_path) -> None:
    key = new_key()
    signed = write_record(synthetic_statement(), tmp_path / "s.json", key)
    unsigned = write_record(synthetic_statement(), tmp_path / "u.json", None)
    assert signed.signed and signed.keyids == (key.keyid,) and not unsigned.signed
    assert signed.record_identity == unsigned.record_identity  # same statement, same payload bytes
    assert signed.to_json()["signed"] is True and unsigned.to_json()["signed"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "u.json"]  # no temporary files left
    raw = write_record(synthetic_statement(), tmp_path / "raw.json", key.private_key)  # a bare cryptography key
    assert raw.keyids == (key.keyid,)


def test_write_is_atomic(tmp_path, monkeypatch) -> None:
    target = tmp_path / "r.json"
    target.write_text("previous record")

    def fail(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.os, "replace", fail)
    with pytest.raises(RecordError, match="cannot write the record: No space left on device"):
        write_record(synthetic_statement(), target, None)
    assert target.read_text() == "previous record"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_write_evidence_writes_one_record_per_implementation(tmp_path) -> None:
    written = write_evidence(synthetic_report(), tmp_path / "h200", None)
    (name,) = [os.path.basename(w.path) for w in written]
    assert name.startswith("pytorch--") and name.endswith(".intoto.json")  # implementation--device--time
    assert written[0].result == "PASSED" and written[0].verdict == "conformant" and not written[0].signed


def test_sign_record_adds_a_signature_and_keeps_the_payload(tmp_path) -> None:
    path = tmp_path / "r.json"
    write_record(synthetic_statement(), path, None)
    before = _payload(path)
    first, second = new_key(), new_key()
    out = sign_record(path, first)
    assert out.signed and _payload(path) == before
    mtime = path.stat().st_mtime_ns
    assert sign_record(path, first).keyids == (first.keyid,)  # signing twice with one key changes nothing
    assert path.stat().st_mtime_ns == mtime
    assert sign_record(path, second).keyids == (first.keyid, second.keyid) and _payload(path) == before
    only_second = trust(tmp_path, (second, {}))
    assert run_verify(VerifyRequest((str(path),), only_second)).exit_code == 0


def test_sign_refuses_broken_records(tmp_path) -> None:
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(RecordError, match="junk.json: not a grpo-conform record: missing field"):
        sign_record(tmp_path / "junk.json", new_key())
    st = synthetic_statement()
    st["predicate"]["result"] = "FINE"
    signed_record(tmp_path / "bad.json", st, None)
    with pytest.raises(RecordError, match="refusing to sign: .*predicate.result"):
        sign_record(tmp_path / "bad.json", new_key())
    with pytest.raises(RecordError, match="no such record file"):
        sign_record(tmp_path / "absent.json", new_key())


def test_run_sign(tmp_path) -> None:
    keyid = keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_record(synthetic_statement(), a, None)
    write_record(synthetic_statement(), b, None)
    report = run_sign(SignRequest((str(a), str(b)), str(tmp_path / "k.pem")))
    assert report.keyid == keyid and report.exit_code == 0 and all(r.signed for r in report.records)
    assert json.dumps(report.to_json())


def test_run_sign_reads_the_environment(tmp_path, monkeypatch) -> None:
    keyid = keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    write_record(synthetic_statement(), tmp_path / "a.json", None)
    monkeypatch.delenv("GRPO_CONFORM_SIGNING_KEY", raising=False)
    monkeypatch.setenv(ENV_SIGNING_KEY_FILE, str(tmp_path / "k.pem"))
    report = run_sign(SignRequest((str(tmp_path / "a.json"),)))
    assert report.keyid == keyid and ENV_SIGNING_KEY_FILE in report.key_source


def test_run_sign_without_a_key_or_with_a_bad_file_signs_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("GRPO_CONFORM_SIGNING_KEY", raising=False)
    monkeypatch.delenv(ENV_SIGNING_KEY_FILE, raising=False)
    write_record(synthetic_statement(), tmp_path / "a.json", None)
    with pytest.raises(SigningKeyError, match="no signing key: pass --key FILE, or set GRPO_CONFORM_SIGNING_KEY"):
        run_sign(SignRequest((str(tmp_path / "a.json"),)))
    keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    (tmp_path / "b.json").write_text("nope")
    with pytest.raises(RecordError):
        run_sign(SignRequest((str(tmp_path / "a.json"), str(tmp_path / "b.json")), str(tmp_path / "k.pem")))
    assert json.loads((tmp_path / "a.json").read_text())["signatures"] == []
