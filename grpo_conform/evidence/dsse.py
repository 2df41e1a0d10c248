"""DSSE v1.0.2 envelopes: pre-authentication encoding, signing, strict parsing, verification.

What is signed is PAE(payloadType, payload), never the envelope's JSON, so the envelope can be
re-indented freely. A verifier must use the payload bytes it verified, not a second parse of the
file: `verified_payload` returns exactly those bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from grpo_conform.errors import GrpoConformError
from grpo_conform.evidence.keys import SigningKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"
_STANDARD = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_URLSAFE = re.compile(r"^[A-Za-z0-9_-]*={0,2}$")


class EnvelopeError(GrpoConformError):
    """A file that is not a well-formed DSSE envelope of an in-toto statement."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """`DSSEv1 SP LEN(type) SP type SP LEN(body) SP body`, lengths in bytes as ASCII decimal."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    """Standard or URL-safe base64, padded or not (DSSE allows all four); anything else is refused."""
    if not isinstance(text, str):
        raise ValueError("expected a base64 string")
    if _STANDARD.match(text):
        normal = text
    elif _URLSAFE.match(text):
        normal = text.replace("-", "+").replace("_", "/")
    else:
        raise ValueError("not base64 (standard or URL-safe)")
    body = normal.rstrip("=")
    if len(body) % 4 == 1:
        raise ValueError("not base64: truncated")
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from None


@dataclass(frozen=True)
class Signature:
    keyid: str  # a hint only: which key to try first, never which key to trust
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]

    @property
    def pae(self) -> bytes:
        return pae(self.payload_type, self.payload)

    def to_json(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": b64encode(self.payload),
            "signatures": [{"keyid": s.keyid, "sig": b64encode(s.sig)} for s in self.signatures],
        }

    def signed_by(self, key: SigningKey) -> "Envelope":
        """This envelope plus a signature by `key` (unchanged if that key already signed it validly)."""
        if any(verify_signature(key.public_key, self.pae, s.sig) for s in self.signatures):
            return self
        new = Signature(key.keyid, key.private_key.sign(self.pae))
        return Envelope(self.payload_type, self.payload, self.signatures + (new,))


def make_envelope(payload: bytes, key: SigningKey | None, payload_type: str = PAYLOAD_TYPE) -> Envelope:
    envelope = Envelope(payload_type, payload, ())
    return envelope.signed_by(key) if key is not None else envelope


def verify_signature(public_key: Ed25519PublicKey, message: bytes, sig: bytes) -> bool:
    try:
        public_key.verify(sig, message)
    except InvalidSignature:
        return False
    return True


MAX_SIGNATURES = 16
MAX_DEPTH = 64


def loads_strict(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON with no duplicate keys (a second value could hide behind the first), no NaN/Infinity and
    at most `max_depth` levels of nesting; every problem is a ValueError saying which."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ValueError(f"duplicate key {k!r}")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_int=json_int)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(exc.msg + f" at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValueError(f"nested too deeply (more than {max_depth} levels are refused)") from None
    depth_problem = _too_deep(value, max_depth)
    if depth_problem:
        raise ValueError(depth_problem)
    return value


def _too_deep(value: Any, limit: int) -> str | None:
    stack = [(value, 1)]
    while stack:  # iterative: a deep document must not exhaust the interpreter's stack here either
        item, depth = stack.pop()
        if depth > limit:
            return f"nested too deeply (more than {limit} levels are refused)"
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return None


_ENVELOPE_FIELDS = {"payloadType", "payload", "signatures"}


def parse_envelope(text: str | bytes, expected_type: str | None = PAYLOAD_TYPE) -> Envelope:
    """Strictly read an envelope; every problem is an `EnvelopeError` saying what was expected.

    Duplicate keys and unknown fields are refused (a second `payload` must not silently win).
    `expected_type=None` leaves the payloadType to the caller (verify still checks the signature
    of an envelope whose type is wrong, to tell tampering from a mislabelled record).
    """
    try:
        doc = loads_strict(text, max_depth=4)
    except ValueError as exc:
        raise EnvelopeError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EnvelopeError("expected a JSON object with payloadType, payload and signatures")
    missing = [k for k in ("payloadType", "payload", "signatures") if k not in doc]
    if missing:
        raise EnvelopeError(f"missing field(s) {', '.join(missing)}; expected a DSSE envelope")
    unknown = sorted(set(doc) - _ENVELOPE_FIELDS)
    if unknown:
        raise EnvelopeError(f"unknown envelope field(s) {unknown}; a DSSE envelope has only {sorted(_ENVELOPE_FIELDS)}")
    if not isinstance(doc["payloadType"], str):
        raise EnvelopeError("payloadType: expected a string")
    if expected_type is not None and doc["payloadType"] != expected_type:
        raise EnvelopeError(wrong_type(doc["payloadType"], expected_type))
    try:
        payload = b64decode(doc["payload"])
    except ValueError as exc:
        raise EnvelopeError(f"payload: {exc}") from None
    if not isinstance(doc["signatures"], list):
        raise EnvelopeError("signatures: expected a list (empty for an unsigned record)")
    if len(doc["signatures"]) > MAX_SIGNATURES:
        raise EnvelopeError(f"{len(doc['signatures'])} signatures; at most {MAX_SIGNATURES} are read")
    return Envelope(doc["payloadType"], payload, tuple(_signature(i, s) for i, s in enumerate(doc["signatures"])))


def wrong_type(found: str, expected: str = PAYLOAD_TYPE) -> str:
    return f"payloadType is {json.dumps(found)}, expected {json.dumps(expected)}"


def _signature(index: int, entry: Any) -> Signature:
    if not isinstance(entry, dict) or "sig" not in entry:
        raise EnvelopeError(f"signatures[{index}]: expected an object with 'sig' (and optionally 'keyid')")
    if set(entry) - {"keyid", "sig"}:
        raise EnvelopeError(f"signatures[{index}]: unknown field(s) {sorted(set(entry) - {'keyid', 'sig'})}")
    if not isinstance(entry["sig"], str) or len(entry["sig"]) > 1024:
        raise EnvelopeError(f"signatures[{index}].sig: expected a base64 string (an Ed25519 signature is 88 characters)")
    keyid = entry.get("keyid", "")
    if not isinstance(keyid, str):
        raise EnvelopeError(f"signatures[{index}].keyid: expected a string")
    try:
        return Signature(keyid, b64decode(entry["sig"]))
    except ValueError as exc:
        raise EnvelopeError(f"signatures[{index}].sig: {exc}") from None


@dataclass(frozen=True)
class Verified:
    """A signature that verified: the key it verified under, and the payload bytes it covers."""

    keyid: str
    signature_index: int
    payload: bytes


def json_int(text: str) -> int | float:
    """An integer literal as RFC 8785 wrote it: beyond 2^53 it can only have been a double (RFC 8785
    prints integral doubles below 1e21 without an exponent), so it is read back as one."""
    value = int(text)
    return value if abs(value) <= 2**53 - 1 else float(value)


def verified_payloads(envelope: Envelope, keys: Iterable[tuple[str, Ed25519PublicKey]]) -> tuple[Verified, ...]:
    """Every (signature, key) pair that verifies. Every key is tried on every signature: keyid is a hint."""
    message = envelope.pae
    keys = list(keys)
    found = []
    for i, s in enumerate(envelope.signatures):
        for keyid, public_key in keys:
            if verify_signature(public_key, message, s.sig):
                found.append(Verified(keyid, i, envelope.payload))
    return tuple(found)
