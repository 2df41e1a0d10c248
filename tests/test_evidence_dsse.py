"""DSSE: the PAE test vector, base64 variants, strict envelope parsing, signing."""

from __future__ import annotations

import base64
import json

import pytest

from grpo_conform.evidence.dsse import (
    PAYLOAD_TYPE,
    EnvelopeError,
    b64decode,
    make_envelope,
    pae,
    parse_envelope,
    verified_payloads,
)
from test_evidence_support import new_key


def test_pae_test_vector() -> None:
    expected = b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    assert pae("http://example.com/HelloWorld", b"hello world") == expected


def test_pae_counts_bytes_not_characters() -> None:
    assert pae("t", "é".encode()) == b"DSSEv1 1 t 2 " + "é".encode()
    assert pae("", b"") == b"DSSEv1 0  0 "


@pytest.mark.parametrize("text", [
    base64.b64encode(b"\xfb\xff\xfe?").decode(),               # standard, padded: "+//+Pw=="
    base64.b64encode(b"\xfb\xff\xfe?").decode().rstrip("="),   # standard, unpadded
    base64.urlsafe_b64encode(b"\xfb\xff\xfe?").decode(),       # URL-safe, padded
    base64.urlsafe_b64encode(b"\xfb\xff\xfe?").decode().rstrip("="),
])
def test_base64_variants_accepted(text) -> None:
    assert b64decode(text) == b"\xfb\xff\xfe?"


@pytest.mark.parametrize("text", ["+//+Pw=_", "a b=", "abcde", "!!!!", "+/-_"])
def test_base64_garbage_refused(text) -> None:
    with pytest.raises(ValueError):
        b64decode(text)


def _doc(**changes):
    doc = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(b"{}").decode(), "signatures": []}
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[]", "expected a JSON object"),
    (json.dumps({"payload": "e30=", "signatures": []}), r"missing field\(s\) payloadType"),
    (_doc(payloadType="application/json"), 'payloadType is "application/json"'),
    (_doc(payload="%%%"), "payload: not base64"),
    (_doc(signatures={}), "signatures: expected a list"),
    (_doc(signatures=[{"keyid": "k"}]), r"signatures\[0\]: expected an object with 'sig'"),
    (_doc(signatures=[{"keyid": 5, "sig": "AA=="}]), r"signatures\[0\].keyid"),
    (_doc(signatures=[{"keyid": "k", "sig": "***"}]), r"signatures\[0\].sig: not base64"),
    (_doc(signatures=[{"keyid": "k", "sig": "AA==", "extra": 1}]), r"signatures\[0\]: unknown field"),
    (_doc(extensions={}), r"unknown envelope field\(s\) \['extensions'\]"),
    ('{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "payload": "e30=", "signatures": []}',
     "duplicate key 'payload'"),
    ('{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": [[[[["x"]]]]]}',
     "nested too deeply"),
])
def test_parse_envelope_refuses(text, message) -> None:
    with pytest.raises(EnvelopeError, match=message):
        parse_envelope(text)


def test_parse_envelope_accepts_missing_keyid_and_urlsafe() -> None:
    key = new_key()
    env = make_envelope(b'{"a":1}', key)
    doc = env.to_json()
    doc["payload"] = base64.urlsafe_b64encode(env.payload).decode().rstrip("=")
    doc["signatures"] = [{"sig": base64.urlsafe_b64encode(env.signatures[0].sig).decode()}]
    parsed = parse_envelope(json.dumps(doc))
    assert parsed.payload == env.payload and parsed.signatures[0].keyid == ""
    assert verified_payloads(parsed, [(key.keyid, key.public_key)])


def test_signature_covers_pae_and_keyid_is_a_hint() -> None:
    key, other = new_key(), new_key()
    env = make_envelope(b"payload", key)
    assert env.signatures[0].keyid == key.keyid
    key.public_key.verify(env.signatures[0].sig, pae(PAYLOAD_TYPE, b"payload"))
    # keyid is not used to pick keys: every key is tried, and only the right one verifies.
    found = verified_payloads(env, [("wrong-hint", other.public_key), ("right", key.public_key)])
    assert [(v.keyid, v.signature_index, v.payload) for v in found] == [("right", 0, b"payload")]


def test_signed_by_adds_once() -> None:
    key, second = new_key(), new_key()
    env = make_envelope(b"x", None)
    assert env.signatures == ()
    once = env.signed_by(key)
    assert once.signed_by(key) is once
    both = once.signed_by(second)
    assert [s.keyid for s in both.signatures] == [key.keyid, second.keyid] and both.payload == b"x"
