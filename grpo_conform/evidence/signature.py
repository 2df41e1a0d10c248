"""The `signature` step of verify: which trusted evidence keys signed these exact bytes, judged when.

Every trusted key is tried on every signature (the keyid is only a hint). A key counts when it is
not revoked and its validity window holds at the trusted time: the token's genTime when an RFC
3161 timestamp from a trusted TSA verifies over that signature, else the verification time
(never the record's own times, which the signer writes). See timestamps.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from grpo_conform.evidence.dsse import Envelope, verified_payloads
from grpo_conform.evidence.keys import TrustedKey
from grpo_conform.evidence.steps import StepResult
from grpo_conform.evidence.terminal import safe
from grpo_conform.evidence.timestamps import TimestampError, token_time


def _short(hexdigest: str) -> str:
    return hexdigest[:16] + "…"


def _fmt(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _judged_at(token: bytes | None, roots: tuple[Any, ...], sig: bytes, now: datetime,
               notes: list[str]) -> tuple[datetime, str]:
    """When to judge a key's validity window: the token's genTime if it verifies, else now."""
    if token is None:
        return now, f"at verification time {_fmt(now)} (no timestamp token: the record's own times are the signer's)"
    if not roots:
        notes.append(f"a timestamp token lies beside the record, but no TSA certificate is trusted (--tsa-cert): "
                     "ignored")
        return now, f"at verification time {_fmt(now)}"
    try:
        when = token_time(token, sig, roots)
    except TimestampError as exc:
        notes.append(f"timestamp token refused ({exc}); judged at verification time instead")
        return now, f"at verification time {_fmt(now)}"
    return when, f"at {_fmt(when)}, the time of its RFC 3161 timestamp"


def signature_step(envelope: Envelope, trusted: tuple[TrustedKey, ...], allow_unsigned: bool, now: datetime,
                   token: bytes | None = None, tsa_roots: tuple[Any, ...] = ()
                   ) -> tuple[StepResult, bytes | None, tuple[dict[str, str], ...]]:
    if not envelope.signatures:
        if allow_unsigned:
            return (StepResult("signature", "accepted-unsigned", "UNSIGNED record, accepted because unsigned "
                               "records are allowed: nobody vouches for its content"), envelope.payload, ())
        return (StepResult("signature", "fail", "unsigned: the record carries no signature (sign it with "
                           "`grpo-conform sign`, or pass --allow-unsigned to accept it as unsigned)"), None, ())
    by_id = {k.keyid: k for k in trusted}
    verified = verified_payloads(envelope, [(k.keyid, k.public_key) for k in trusted])
    if not verified:
        hints = ", ".join(_short(s.keyid) for s in envelope.signatures if s.keyid) or "none"
        return (StepResult("signature", "fail", f"none of the {len(envelope.signatures)} signature(s) verifies "
                           f"under any of the {len(trusted)} trusted key(s) (keyid hints: {safe(hints)}); the record "
                           "was changed after signing, or signed by a key the trust root does not name"), None, ())
    problems: list[str] = []
    notes: list[str] = []
    good: list[dict[str, str]] = []
    for v in verified:
        key = by_id[v.keyid]
        who = f"key {_short(key.keyid)} ({key.owner})"
        when, how = _judged_at(token, tsa_roots, envelope.signatures[v.signature_index].sig, now, notes)
        if key.revoked:
            problems.append(f"{who} verifies but is revoked: {key.revoked_reason or 'no reason given'}")
        elif not key.valid_at(when):
            problems.append(f"{who} verifies, but the key is valid {key.window()}, judged {how}"
                            + (f" and it is now {_fmt(now)}: re-sign the record with a current key" if when == now
                               else ""))
        elif key.keyid not in {g["keyid"] for g in good}:
            good.append({"keyid": key.keyid, "owner": key.owner, "public_key": key.public_key_file})
            notes.append(f"{who}: validity judged {how}")
    if not good:
        return StepResult("signature", "fail", "; ".join(problems), tuple(dict.fromkeys(notes))), None, ()
    names = ", ".join(f"{g['owner']} (key {_short(g['keyid'])})" for g in good)
    return (StepResult("signature", "pass", f"signed by {names}", (*problems, *dict.fromkeys(notes))),
            envelope.payload, tuple(good))
