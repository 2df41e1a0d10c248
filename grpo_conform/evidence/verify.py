"""`grpo-conform verify FILE...`: every record through four named steps, each failure said plainly.

1. envelope    - valid JSON, DSSE fields, payloadType application/vnd.in-toto+json, base64 decodes;
2. signature   - a signature verifies under a trusted, non-revoked key whose validity window holds
                 the record's run.finished (every trusted key is tried: the keyid is only a hint);
                 an unsigned record fails unless unsigned records are allowed;
3. schema      - the verified payload is JSON and validates against the published schema;
4. identities  - the record identity (sha256 of the payload) is reported; the spec and
                 implementation identities are recomputed from this tree where it has them.
Schema and identities are skipped after a failed envelope or signature step: an unverified payload
is never interpreted. The signature is still checked when only the payloadType is wrong, which
tells a changed type (no signature verifies) from a record signed with the wrong type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from grpo_conform.canonical import sha256_hex
from grpo_conform.errors import EXIT_FAILED, EXIT_OK, GrpoConformError
from grpo_conform.evidence.dsse import PAYLOAD_TYPE, Envelope, EnvelopeError, parse_envelope, verified_payloads, \
    wrong_type
from grpo_conform.evidence.keys import DEFAULT_TRUSTED_KEYS, TrustedKey, load_trusted_keys, parse_time
from grpo_conform.evidence.identities import IdentityCheck, check_identities
from grpo_conform.evidence.statement import PROJECT_ROOT, schema_problems

StepName = Literal["envelope", "signature", "schema", "identities"]
StepStatus = Literal["pass", "fail", "skipped", "accepted-unsigned"]
STEPS: tuple[StepName, ...] = ("envelope", "signature", "schema", "identities")


@dataclass(frozen=True)
class VerifyRequest:
    files: tuple[str, ...]
    trusted_keys: str | None = None  # None: ./evidence/keys/trusted-keys.json, else the checkout's
    allow_unsigned: bool = False


@dataclass(frozen=True)
class StepResult:
    step: StepName
    status: StepStatus
    message: str
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "accepted-unsigned")

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "status": self.status, "message": self.message, "notes": list(self.notes)}


@dataclass(frozen=True)
class FileVerification:
    path: str
    steps: tuple[StepResult, ...]
    record_identity: str | None = None
    subject: str | None = None
    result: str | None = None
    verdict: str | None = None
    signers: tuple[dict[str, str], ...] = ()
    identities: tuple[IdentityCheck, ...] = ()

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)

    @property
    def unsigned(self) -> bool:
        return any(s.status == "accepted-unsigned" for s in self.steps)

    def step(self, name: StepName) -> StepResult:
        return next(s for s in self.steps if s.step == name)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "unsigned": self.unsigned,
                "record_identity": {"sha256": self.record_identity} if self.record_identity else None,
                "subject": self.subject, "result": self.result, "verdict": self.verdict,
                "signers": list(self.signers), "steps": [s.to_json() for s in self.steps],
                "identities": [i.to_json() for i in self.identities]}


@dataclass(frozen=True)
class VerifyReport:
    trusted_keys: str
    allow_unsigned: bool
    files: tuple[FileVerification, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.files and all(f.ok for f in self.files) else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        return {"trusted_keys": self.trusted_keys, "allow_unsigned": self.allow_unsigned,
                "ok": self.exit_code == EXIT_OK, "files": [f.to_json() for f in self.files],
                "exit_code": self.exit_code}


def default_trusted_keys() -> Path:
    local = Path.cwd() / DEFAULT_TRUSTED_KEYS
    return local if local.is_file() else PROJECT_ROOT / DEFAULT_TRUSTED_KEYS


def run_verify(request: VerifyRequest) -> VerifyReport:
    if not request.files:
        raise GrpoConformError("verify: no record files given")
    keys_file = Path(request.trusted_keys) if request.trusted_keys else default_trusted_keys()
    trusted = load_trusted_keys(keys_file)  # a broken list is a usage error (exit 2), not a bad record
    return VerifyReport(str(keys_file), request.allow_unsigned,
                        tuple(verify_file(f, trusted, request.allow_unsigned) for f in request.files))


def _skipped(after: StepName, failed: StepName | None = None) -> list[StepResult]:
    """The steps after `after`, not run because `failed` (default: `after`) failed."""
    rest = STEPS[STEPS.index(after) + 1:]
    return [StepResult(s, "skipped", f"not checked: the {failed or after} step failed") for s in rest]


def verify_file(path: str, trusted: tuple[TrustedKey, ...], allow_unsigned: bool) -> FileVerification:
    try:
        envelope = parse_envelope(Path(path).read_bytes(), expected_type=None)
    except OSError as exc:
        steps = [StepResult("envelope", "fail", f"cannot read the file: {exc.strerror}"), *_skipped("envelope")]
        return FileVerification(path, tuple(steps))
    except EnvelopeError as exc:
        return FileVerification(path, (StepResult("envelope", "fail", str(exc)), *_skipped("envelope")))
    if envelope.payload_type != PAYLOAD_TYPE:
        # Still check the signature: it tells a changed type (no valid signature) from a mislabelled record.
        steps = [StepResult("envelope", "fail", wrong_type(envelope.payload_type))]
    else:
        steps = [StepResult("envelope", "pass", f"DSSE envelope, {len(envelope.signatures)} signature(s)")]

    signature, payload, signers = _signature_step(envelope, trusted, allow_unsigned)
    steps.append(signature)
    if payload is None or not steps[0].ok:
        failed: StepName = "envelope" if not steps[0].ok else "signature"
        return FileVerification(path, tuple(steps + _skipped("signature", failed)), signers=signers)
    # From here on only `payload`, the bytes the signature covers (or, unsigned, the decoded payload).
    record_identity = sha256_hex(payload)
    try:
        statement = loads_strict(payload)
    except ValueError as exc:
        steps.append(StepResult("schema", "fail", f"the payload is not JSON: {exc}"))
        return FileVerification(path, tuple(steps + _skipped("schema")), record_identity, signers=signers)
    problems = schema_problems(statement)
    if problems:
        steps.append(StepResult("schema", "fail", f"breaks evidence-statement.v1.schema.json: {problems[0]}",
                                tuple(problems[1:20])))
        return FileVerification(path, tuple(steps + _skipped("schema")), record_identity, signers=signers)
    steps.append(StepResult("schema", "pass", "statement valid against evidence-statement.v1.schema.json"))
    found = check_identities(statement, record_identity)
    if found.problems:
        steps.append(StepResult("identities", "fail", "; ".join(found.problems), found.notes))
    else:
        steps.append(StepResult("identities", "pass", "consistent with each other and with this tree", found.notes))
    predicate = statement["predicate"]
    return FileVerification(path, tuple(steps), record_identity, statement["subject"][0]["name"],
                            predicate["result"], predicate["verdict"], signers, found.checks)


def loads_strict(data: bytes) -> Any:
    """JSON with no duplicate keys (a second value could hide behind the first) and no NaN/Infinity."""
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
        return json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(exc.msg + f" at line {exc.lineno} column {exc.colno}") from None


def _short(hexdigest: str) -> str:
    return hexdigest[:16] + "…"


def _signature_step(envelope: Envelope, trusted: tuple[TrustedKey, ...], allow_unsigned: bool
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
                           f"under any of the {len(trusted)} trusted key(s) (keyid hints: {hints}); the record was "
                           "changed after signing, or signed by a key that is not trusted"), None, ())
    problems: list[str] = []
    for v in verified:
        key = by_id[v.keyid]
        who = f"key {_short(key.keyid)} ({key.owner})"
        if key.revoked:
            reason = f": {key.revoked_reason}" if key.revoked_reason else ""
            problems.append(f"{who} verifies but is revoked{reason}")
            continue
        try:
            finished = parse_time(loads_strict(v.payload)["predicate"]["run"]["finished"])
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{who} verifies, but the signed statement has no readable predicate.run.finished "
                            f"({exc}), so the key's validity window cannot be checked")
            continue
        if not key.valid_at(finished):
            problems.append(f"{who} verifies, but the record finished at {finished.strftime('%Y-%m-%dT%H:%M:%SZ')}, "
                            f"outside the key's validity window {key.window()}")
            continue
        signer = {"keyid": key.keyid, "owner": key.owner, "public_key": key.public_key_file}
        return (StepResult("signature", "pass", f"signed by {key.owner} (key {_short(key.keyid)})", tuple(problems)),
                v.payload, (signer,))
    return StepResult("signature", "fail", "; ".join(problems)), None, ()
