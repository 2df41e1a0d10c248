"""verify: each step has a record that must pass it and records that must fail it."""

from __future__ import annotations

import base64
import copy
import json

import pytest

from grpo_conform.canonical import sha256_hex
from grpo_conform.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from grpo_conform.evidence import TrustedKeysError, VerifyRequest, run_verify, sign_record, write_record
from grpo_conform.evidence.statement import PROJECT_ROOT
from test_evidence_support import NOW, b64, make_project, new_key, signed_record, statement_for, trust_list, verify


@pytest.fixture()
def proj(tmp_path):
    return make_project(tmp_path / "proj")


@pytest.fixture()
def signed(proj, tmp_path):
    """A valid record signed by a trusted key: (record path, trust list path, key)."""
    key = new_key()
    path = proj / "evidence" / "r.intoto.json"
    write_record(statement_for(proj), path, key)
    return str(path), trust_list(tmp_path, (key, {})), key


def verify_one(path, trusted, **kw):
    return verify(path, trusted, **kw).files[0]


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


ALL_PASS = {"envelope": "pass", "signature": "pass", "schema": "pass", "semantics": "pass", "identities": "pass",
            "policy": "not-applied"}
AFTER_SIGNATURE = {"schema": "skipped", "semantics": "skipped", "identities": "skipped", "policy": "skipped"}


# -- envelope ---------------------------------------------------------------------------------
def test_valid_record_passes_every_step(signed) -> None:
    path, trusted, key = signed
    report = verify(path, trusted)
    assert report.exit_code == EXIT_OK
    f = report.files[0]
    assert _statuses(f) == ALL_PASS
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
    assert [s.status for s in f.steps[1:]] == ["skipped"] * 5 and not f.ok


def test_missing_file_fails_envelope(tmp_path, signed) -> None:
    f = verify_one(str(tmp_path / "absent.json"), signed[1])
    assert f.step("envelope").status == "fail" and "cannot read the file" in f.step("envelope").message


# -- signature --------------------------------------------------------------------------------
def test_changed_payload_byte_fails_signature(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d.update(payload=_flip(d["payload"], 200)))
    f = verify_one(path, trusted)
    assert _statuses(f) == {"envelope": "pass", "signature": "fail", **AFTER_SIGNATURE}
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
    other = trust_list(tmp_path, (new_key(), {}), name="other.json")
    f = verify_one(path, other)
    assert f.step("signature").status == "fail" and "a key the trust root does not name" in f.step("signature").message


def test_keyid_is_only_a_hint(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d["signatures"][0].update(keyid="f" * 64))
    assert verify_one(path, trusted).ok
    _edit(path, lambda d: d["signatures"][0].pop("keyid"))
    assert verify_one(path, trusted).ok


def test_revoked_key_fails(tmp_path, signed) -> None:
    path, _, key = signed
    trusted = trust_list(tmp_path, (key, {"revoked": True, "revoked_reason": "laptop stolen"}), name="revoked.json")
    f = verify_one(path, trusted)
    assert f.step("signature").status == "fail"
    assert "revoked: laptop stolen" in f.step("signature").message


@pytest.mark.parametrize("window", [
    {"valid_from": "2025-01-01T00:00:00Z", "valid_until": "2026-12-01T12:00:00Z"},  # ends exactly now
    {"valid_from": "2026-12-01T12:00:01Z"},                                         # starts after now
])
def test_key_outside_its_validity_window_now_fails(tmp_path, signed, window) -> None:
    """Judged at the verification time, not at the record's run.finished (which the signer writes)."""
    path, _, key = signed
    f = verify_one(path, trust_list(tmp_path, (key, window), name="window.json"))
    assert f.step("signature").status == "fail"
    assert "and it is now 2026-12-01T12:00:00Z: re-sign the record with a current key" in f.step("signature").message


def test_key_inside_its_window_passes_whatever_the_record_says(tmp_path, signed) -> None:
    path, _, key = signed
    window = {"valid_from": "2026-12-01T11:00:00Z", "valid_until": "2026-12-01T13:00:00Z"}  # after run.finished
    f = verify_one(path, trust_list(tmp_path, (key, window), name="window.json"))
    assert f.ok and any("no timestamp token" in n for n in f.step("signature").notes)


def test_one_good_signature_among_bad_ones_passes(tmp_path, signed) -> None:
    path, _, key = signed
    revoked, untrusted = new_key(), new_key()
    sign_record(path, revoked)
    sign_record(path, untrusted)
    trusted = trust_list(tmp_path, (revoked, {"revoked": True}), (key, {}), name="mixed.json")
    f = verify_one(path, trusted)
    assert f.ok and f.signers[0]["keyid"] == key.keyid


def test_unsigned_record(proj, signed) -> None:
    trusted = signed[1]
    path = str(proj / "unsigned.json")
    written = write_record(statement_for(proj), path, None)
    assert not written.signed
    f = verify_one(path, trusted)
    assert f.step("signature").status == "fail" and "unsigned" in f.step("signature").message
    assert verify(path, trusted).exit_code == EXIT_FAILED
    report = verify(path, trusted, allow_unsigned=True)
    f = report.files[0]
    assert report.exit_code == EXIT_OK and f.unsigned and f.step("signature").status == "accepted-unsigned"
    assert "UNSIGNED" in f.step("signature").message and f.step("schema").status == "pass"
    assert report.lines()[1].startswith("UNSIGNED")


def test_allow_unsigned_does_not_excuse_a_bad_signature(signed) -> None:
    path, trusted, _ = signed
    _edit(path, lambda d: d.update(payload=_flip(d["payload"], 50)))
    assert verify_one(path, trusted, allow_unsigned=True).step("signature").status == "fail"


# -- schema -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["predicate"].update(result="GREAT"), "$.predicate.result"),
    (lambda s: s["predicate"]["run"].pop("finished"), "finished"),
    (lambda s: s["predicate"]["spec"].update(identity="xyz"), "$.predicate.spec.identity"),
])
def test_schema_violations_fail_schema(tmp_path, proj, mutate, message) -> None:
    key = new_key()
    st = copy.deepcopy(statement_for(proj))
    mutate(st)
    path = signed_record(tmp_path / "r.json", st, key)
    f = verify_one(path, trust_list(tmp_path, (key, {})), allow_unsigned=True)
    failing = [s for s in f.steps if s.status == "fail"]
    assert failing and message in failing[0].message, f.to_json()
    unsigned = signed_record(tmp_path / "u.json", st, None)
    g = verify_one(unsigned, trust_list(tmp_path, (key, {})), allow_unsigned=True)
    assert g.step("schema").status == "fail" and message in g.step("schema").message


@pytest.mark.parametrize("payload, message", [
    (b"not json", "the payload is not strict JSON"),
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


def test_changed_implementation_folder_fails_identities(proj, signed) -> None:
    path, trusted, _ = signed
    recorded = json.loads(base64.b64decode(json.loads(open(path).read())["payload"]))["predicate"]["implementation"]
    with open(proj / "implementations" / "pytorch" / "impl.py", "a") as fh:
        fh.write("\n# changed\n")
    f = verify_one(path, trusted)
    step = f.step("identities")
    assert step.status == "fail"
    assert f"implementation implementations/pytorch: recorded {recorded['identity']}, recomputed" in step.message
    assert {c.kind: c.status for c in f.identities}["implementation"] == "differs"


def test_changed_spec_identity_fails_identities(tmp_path, proj) -> None:
    st = statement_for(proj)
    st["predicate"]["spec"]["identity"] = "0" * 64
    st["predicate"]["configuration"][0]["digest"]["rfc8785Sha256"] = "0" * 64
    key = new_key()
    f = verify_one(signed_record(proj / "r.json", st, key), trust_list(tmp_path, (key, {})))
    assert f.step("identities").status == "fail"
    assert f"spec grpo-token-is@1.0.0: recorded {'0' * 64}, recomputed" in f.step("identities").message


def test_changed_spec_file_fails_identities(tmp_path, proj, signed) -> None:
    path, trusted, _ = signed
    spec = proj / "specs" / "grpo-token-is.v1.json"
    spec.write_text(spec.read_text() + "\n")  # same JSON, other bytes: the file's sha256 catches it
    f = verify_one(path, trusted)
    assert f.step("identities").status == "fail" and "spec-file specs/grpo-token-is.v1.json" in \
        f.step("identities").message


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["subject"][0]["digest"].update(dirHash="1" * 64), "subject[0].digest.dirHash 1111111111111111…"),
    (lambda s: s["predicate"]["configuration"][1]["digest"].update(dirHash="2" * 64),
     "configuration implementation:pytorch: digest.dirHash is not the implementation identity"),
    (lambda s: s["predicate"]["configuration"].append(dict(s["predicate"]["configuration"][0], name="spec:x@2.0.0")),
     "expected exactly one 'spec:' descriptor, found 2"),
])
def test_inconsistent_statement_fails_semantics(tmp_path, proj, mutate, message) -> None:
    st = copy.deepcopy(statement_for(proj))
    mutate(st)
    key = new_key()
    f = verify_one(signed_record(proj / "r.json", st, key), trust_list(tmp_path, (key, {})))
    assert f.step("schema").status == "pass", f.step("schema").message
    assert f.step("semantics").status == "fail" and message in f.step("semantics").message


# -- the report -------------------------------------------------------------------------------
def test_exit_code_needs_every_file_to_pass(proj, signed) -> None:
    path, trusted, _ = signed
    unsigned = str(proj / "u.json")
    write_record(statement_for(proj), unsigned, None)
    assert verify([path, path], trusted).exit_code == EXIT_OK
    assert verify([path, unsigned], trusted).exit_code == EXIT_FAILED


def test_trust_list_problems_are_usage_errors(tmp_path, signed) -> None:
    with pytest.raises(TrustedKeysError) as err:
        verify(signed[0], str(tmp_path / "no-such-list.json"))
    assert err.value.exit_code == EXIT_USAGE


def test_default_trust_is_the_shipped_root_never_the_current_directory(signed, monkeypatch) -> None:
    monkeypatch.chdir(PROJECT_ROOT)
    report = run_verify(VerifyRequest((signed[0],), now=NOW))
    assert report.trust.startswith("shipped trust root") and not report.trust_override
    assert report.files[0].step("signature").status == "fail"  # a throw-away key is not the maintainers'
    assert json.dumps(report.to_json())
