"""verify: each of the four steps has a record that must pass it and records that must fail it."""

from __future__ import annotations

import base64
import copy
import json
import shutil

import pytest

from grpo_conform.canonical import sha256_hex
from grpo_conform.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from grpo_conform.evidence import (
    TrustedKeysError,
    VerifyRequest,
    build_statement,
    run_verify,
    sign_record,
    write_record,
)
from grpo_conform.evidence.statement import PROJECT_ROOT
from test_evidence_support import (
    FINISHED,
    b64,
    new_key,
    signed_record,
    synthetic_impl,
    synthetic_report,
    synthetic_statement,
    trust,
    verify_one,
)


@pytest.fixture()
def signed(tmp_path):
    """A valid record signed by a trusted key: (record path, trust list path, key)."""
    key = new_key()
    path = tmp_path / "r.intoto.json"
    write_record(synthetic_statement(), path, key)
    return str(path), trust(tmp_path, (key, {})), key


def _edit(path: str, change) -> str:
    doc = json.loads(open(path).read())
    change(doc)
    open(path, "w").write(json.dumps(doc))
    return path


def _flip(b64text: str, index: int) -> str:
    raw = bytearray(base64.b64decode(b64text))
    raw[index] ^= 0x01
    return b64(bytes(raw))


def _statuses(f) -> dict[str, str]:
    return {s.step: s.status for s in f.steps}


# -- envelope ---------------------------------------------------------------------------------
def test_valid_record_passes_every_step(signed) -> None:
    path, trusted, key = signed
    report = run_verify(VerifyRequest((path,), trusted))
    assert report.exit_code == EXIT_OK
    f = report.files[0]
    assert _statuses(f) == {"envelope": "pass", "signature": "pass", "schema": "pass", "identities": "pass"}
    assert f.signers[0]["keyid"] == key.keyid and f.subject == "implementations/pytorch"
    assert f.result == "PASSED" and f.verdict == "conformant" and not f.unsigned
    assert json.loads(json.dumps(report.to_json()))["files"][0]["ok"] is True


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    (json.dumps({"payloadType": "application/vnd.in-toto+json", "signatures": []}), "missing field"),
    (json.dumps({"payloadType": "application/vnd.in-toto+json", "payload": "@@", "signatures": []}), "not base64"),
])
def test_envelope_failures(tmp_path, signed, content, message) -> None:
    _, trusted, _ = signed
    (tmp_path / "bad.json").write_text(content)
    f = verify_one(str(tmp_path / "bad.json"), trusted, allow_unsigned=True)
    assert f.step("envelope").status == "fail" and message in f.step("envelope").message
    assert [s.status for s in f.steps[1:]] == ["skipped"] * 3 and not f.ok


def test_missing_file_fails_envelope(tmp_path, signed) -> None:
    f = verify_one(str(tmp_path / "absent.json"), signed[1])
    assert f.step("envelope").status == "fail" and "cannot read the file" in f.step("envelope").message


# -- signature --------------------------------------------------------------------------------
def test_changed_payload_byte_fails_signature(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d.update(payload=_flip(d["payload"], 200)))
    f = verify_one(path, trusted)
    assert _statuses(f) == {"envelope": "pass", "signature": "fail", "schema": "skipped", "identities": "skipped"}
    assert "none of the 1 signature(s) verifies under any of the 1 trusted key(s)" in f.step("signature").message


def test_changed_payload_type_fails_signature(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d.update(payloadType=d["payloadType"][:-1] + "N"))
    f = verify_one(path, trusted)
    assert f.step("envelope").status == "fail" and "payloadType" in f.step("envelope").message
    assert f.step("signature").status == "fail" and not f.ok


def test_changed_signature_byte_fails_signature(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d["signatures"][0].update(sig=_flip(d["signatures"][0]["sig"], 10)))
    f = verify_one(path, trusted)
    assert f.step("envelope").status == "pass" and f.step("signature").status == "fail"


def test_wrong_key_fails(tmp_path, signed) -> None:
    path, _, _ = signed
    other = trust(tmp_path, (new_key(), {}), name="other.json")
    f = verify_one(path, other)
    assert f.step("signature").status == "fail" and "not trusted" in f.step("signature").message


def test_keyid_is_only_a_hint(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d["signatures"][0].update(keyid="f" * 64))
    assert verify_one(path, trusted).ok
    _edit(path, lambda d: d["signatures"][0].pop("keyid"))
    assert verify_one(path, trusted).ok


def test_revoked_key_fails(tmp_path, signed) -> None:
    path, _, key = signed
    trusted = trust(tmp_path, (key, {"revoked": True, "revoked_reason": "laptop stolen"}), name="revoked.json")
    f = verify_one(path, trusted)
    assert f.step("signature").status == "fail"
    assert "revoked: laptop stolen" in f.step("signature").message


@pytest.mark.parametrize("window", [
    {"valid_from": "2025-01-01T00:00:00Z", "valid_until": "2026-12-01T10:00:05Z"},  # ends exactly at finished
    {"valid_from": "2026-12-01T10:00:06Z"},                                         # starts after
])
def test_key_outside_its_validity_window_fails(tmp_path, signed, window) -> None:
    path, _, key = signed
    f = verify_one(path, trust(tmp_path, (key, window), name="window.json"))
    assert f.step("signature").status == "fail"
    assert f"record finished at {FINISHED}, outside the key's validity window" in f.step("signature").message


def test_key_inside_its_window_passes(tmp_path, signed) -> None:
    path, _, key = signed
    window = {"valid_from": FINISHED, "valid_until": "2026-12-01T10:00:06Z"}
    assert verify_one(path, trust(tmp_path, (key, window), name="window.json")).ok


def test_one_good_signature_among_bad_ones_passes(tmp_path, signed) -> None:
    path, _, key = signed
    revoked, untrusted = new_key(), new_key()
    sign_record(path, revoked)
    sign_record(path, untrusted)
    trusted = trust(tmp_path, (revoked, {"revoked": True}), (key, {}), name="mixed.json")
    f = verify_one(path, trusted)
    assert f.ok and f.signers[0]["keyid"] == key.keyid


def test_unsigned_record(tmp_path, signed) -> None:
    trusted = signed[1]
    path = str(tmp_path / "unsigned.json")
    written = write_record(synthetic_statement(), path, None)
    assert not written.signed
    f = verify_one(path, trusted)
    assert f.step("signature").status == "fail" and "unsigned" in f.step("signature").message
    assert run_verify(VerifyRequest((path,), trusted)).exit_code == EXIT_FAILED
    report = run_verify(VerifyRequest((path,), trusted, allow_unsigned=True))
    f = report.files[0]
    assert report.exit_code == EXIT_OK and f.unsigned and f.step("signature").status == "accepted-unsigned"
    assert "UNSIGNED" in f.step("signature").message and f.step("schema").status == "pass"


def test_allow_unsigned_does_not_excuse_a_bad_signature(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d.update(payload=_flip(d["payload"], 50)))
    assert verify_one(path, trusted, allow_unsigned=True).step("signature").status == "fail"


# -- schema -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["predicate"].update(result="GREAT"), "$.predicate.result"),
    (lambda s: s["predicate"]["run"].pop("finished"), "finished"),  # signed: the window is uncheckable
    (lambda s: s["predicate"]["spec"].update(identity="xyz"), "$.predicate.spec.identity"),
])
def test_schema_violations_fail_schema(tmp_path, mutate, message) -> None:
    key = new_key()
    st = copy.deepcopy(synthetic_statement())
    mutate(st)
    path = signed_record(tmp_path / "r.json", st, key)
    f = verify_one(path, trust(tmp_path, (key, {})), allow_unsigned=True)
    failing = [s for s in f.steps if s.status == "fail"]
    assert failing and message in failing[0].message, f.to_json()
    unsigned = signed_record(tmp_path / "u.json", st, None)
    g = verify_one(unsigned, trust(tmp_path, (key, {})), allow_unsigned=True)
    assert g.step("schema").status == "fail" and message in g.step("schema").message


@pytest.mark.parametrize("payload, message", [
    (b"not json", "the payload is not JSON"),
    (b'{"_type": 1, "_type": 2}', "duplicate key '_type'"),
    (b'{"x": NaN}', "NaN is not JSON"),
])
def test_payload_that_is_not_strict_json_fails_schema(tmp_path, signed, payload, message) -> None:
    path = signed_record(tmp_path / "x.json", payload, None)
    f = verify_one(path, signed[1], allow_unsigned=True)
    assert f.step("schema").status == "fail" and message in f.step("schema").message


# -- identities -------------------------------------------------------------------------------
def test_record_identity_is_reported(signed) -> None:
    path, trusted, _ = signed
    f = verify_one(path, trusted)
    payload = base64.b64decode(json.loads(open(path).read())["payload"])
    assert f.record_identity == sha256_hex(payload)
    assert f"record identity sha256 {sha256_hex(payload)}" in f.step("identities").notes


def test_changed_implementation_folder_fails_identities(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "implementations" / "pytorch"
    shutil.copytree(PROJECT_ROOT / "implementations" / "pytorch", folder,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    key = new_key()
    statement = build_statement(synthetic_report(), synthetic_impl(folder))
    path = str(tmp_path / "r.json")
    write_record(statement, path, key)
    trusted = trust(tmp_path, (key, {}))
    assert verify_one(path, trusted).ok
    with open(folder / "impl.py", "a") as fh:
        fh.write("\n# changed\n")
    f = verify_one(path, trusted)
    step = f.step("identities")
    recorded = statement["predicate"]["implementation"]["identity"]
    assert step.status == "fail" and f"implementation implementations/pytorch: recorded sha256 {recorded}, " \
        "this tree has" in step.message
    assert {c.kind: c.status for c in f.identities}["implementation"] == "differs"


def test_absent_folder_and_spec_are_notes(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "elsewhere" / "gone"
    shutil.copytree(PROJECT_ROOT / "implementations" / "pytorch", folder,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    st = build_statement(synthetic_report(), synthetic_impl(folder))
    st["predicate"]["spec"].update(id="some-other-spec")
    st["predicate"]["configuration"][0].pop("uri")
    shutil.rmtree(folder)
    key = new_key()
    path = signed_record(tmp_path / "r.json", st, key)
    f = verify_one(path, trust(tmp_path, (key, {})))
    assert f.ok, f.to_json()
    notes = " | ".join(f.step("identities").notes)
    assert "implementation elsewhere/gone: not recomputed" in notes
    assert "spec some-other-spec@1.0.0: not recomputed" in notes
    assert {c.kind: c.status for c in f.identities} == {"record": "match", "spec": "not-recomputed",
                                                        "implementation": "not-recomputed"}


def test_changed_spec_identity_fails_identities(tmp_path) -> None:
    st = synthetic_statement()
    st["predicate"]["spec"]["identity"] = "0" * 64
    st["predicate"]["configuration"][0]["digest"]["sha256"] = "0" * 64
    key = new_key()
    f = verify_one(signed_record(tmp_path / "r.json", st, key), trust(tmp_path, (key, {})))
    assert f.step("identities").status == "fail"
    assert f"spec grpo-token-is@1.0.0: recorded sha256 {'0' * 64}, this tree has" in f.step("identities").message


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["subject"][0]["digest"].update(sha256="1" * 64), "subject digest 1111111111111111… differs"),
    (lambda s: s["predicate"]["configuration"][1]["digest"].update(sha256="2" * 64),
     "configuration implementation:pytorch digest 2222222222222222… differs"),
    (lambda s: s["predicate"]["configuration"][0].update(name="the-spec"), "no 'spec:...' resource descriptor"),
])
def test_inconsistent_statement_fails_identities(tmp_path, mutate, message) -> None:
    st = copy.deepcopy(synthetic_statement())
    mutate(st)
    key = new_key()
    f = verify_one(signed_record(tmp_path / "r.json", st, key), trust(tmp_path, (key, {})))
    assert f.step("schema").status == "pass"
    assert f.step("identities").status == "fail" and message in f.step("identities").message


# -- the report -------------------------------------------------------------------------------
def test_exit_code_needs_every_file_to_pass(tmp_path, signed) -> None:
    path, trusted, _ = signed
    unsigned = str(tmp_path / "u.json")
    write_record(synthetic_statement(), unsigned, None)
    assert run_verify(VerifyRequest((path, path), trusted)).exit_code == EXIT_OK
    assert run_verify(VerifyRequest((path, unsigned), trusted)).exit_code == EXIT_FAILED


def test_trust_list_problems_are_usage_errors(tmp_path, signed) -> None:
    with pytest.raises(TrustedKeysError) as err:
        run_verify(VerifyRequest((signed[0],), str(tmp_path / "no-such-list.json")))
    assert err.value.exit_code == EXIT_USAGE


def test_default_trust_list_is_the_committed_one(signed, monkeypatch) -> None:
    monkeypatch.chdir(PROJECT_ROOT)
    report = run_verify(VerifyRequest((signed[0],)))
    assert report.trusted_keys.endswith("evidence/keys/trusted-keys.json")
    assert report.files[0].step("signature").status == "fail"  # a throw-away key is not the maintainers'

