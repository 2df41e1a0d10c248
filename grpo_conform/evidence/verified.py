"""One record's payload, read only after `verify` accepted it: what `merge` counts (issue 29).

The bytes returned are those whose sha256 is the record identity verification reported, so a file
swapped between the two reads is refused rather than trusted.
"""

from __future__ import annotations

from grpo_conform.canonical import sha256_hex
from grpo_conform.evidence.records import RecordError, read_envelope
from grpo_conform.evidence.verify import VerifyRequest, run_verify


def verified_payload(path: str, trusted_keys: str | None = None, project: str | None = None) -> bytes:
    """The payload after every step of `verify` passed (signed); a RecordError naming the first failure."""
    (result,) = run_verify(VerifyRequest((path,), trusted_keys=trusted_keys, project=project)).files
    bad = next((s for s in result.steps if not s.ok), None)
    if bad is not None or result.unsigned or not result.record_identity:
        why = f"{bad.step} {bad.status}: {bad.message}" if bad is not None else "not signed"
        raise RecordError(path, f"does not verify ({why}); only records that `grpo-conform verify` accepts count")
    payload = read_envelope(path).payload
    if sha256_hex(payload) != result.record_identity:
        raise RecordError(path, "the file changed while it was read; run again")
    return payload
