"""`grpo-conform verify FILE...`: every record through six named steps, each failure said plainly.

1. envelope    - size caps, strict JSON (no duplicate keys, no unknown fields), DSSE fields, payloadType;
2. signature   - a signature verifies under an evidence key of the trust root (shipped with the
                 package and verified up to the pinned root keys, unless overridden explicitly),
                 not revoked and valid at the verification time (the record's own times are
                 written by the signer, so they cannot extend a key's life); unsigned fails unless allowed;
3. schema      - the verified payload is strict JSON and validates against its predicate version's schema;
4. semantics   - payload bytes are their RFC 8785 form; one subject bound to the implementation; result,
                 verdict and test lists follow from the per-check statuses (`semantics.py`, shared with sign);
5. identities  - implementation and spec recomputed from the record's project (the tree, else the recorded
                 commit); what cannot be recomputed is `unverified`, which fails unless allowed;
6. policy      - what the user expects (`policy.py`); without a policy the result is shown, not judged.
Later steps read only the payload bytes the signature covers and are skipped after a failure.
No file's failure, however malformed, stops the others.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_conform.canonical import sha256_hex
from grpo_conform.errors import EXIT_FAILED, EXIT_OK, GrpoConformError
from grpo_conform.evidence.dsse import PAYLOAD_TYPE, Envelope, EnvelopeError, loads_strict, parse_envelope, wrong_type
from grpo_conform.evidence.identities import IdentityCheck, implementation_check, project_root_for, spec_checks
from grpo_conform.evidence.keys import TrustedKey, load_trusted_keys
from grpo_conform.evidence.policy import Policy, policy_problems
from grpo_conform.evidence.semantics import canonical_problem, coverage_phrase, future_problem, semantic_problems
from grpo_conform.evidence.statement import schema_file_for, schema_problems
from grpo_conform.evidence.signature import signature_step
from grpo_conform.evidence.spec_semantics import spec_problems
from grpo_conform.evidence.steps import STEPS, StepName, StepResult, StepStatus  # noqa: F401 (re-exported)
from grpo_conform.evidence.terminal import safe
from grpo_conform.evidence.timestamps import MAX_TOKEN_BYTES, load_tsa_roots, token_path
from grpo_conform.evidence.trust import TrustRoot, load_trust_root

MAX_RECORD_BYTES = 32 << 20
MAX_PAYLOAD_BYTES = 24 << 20


@dataclass(frozen=True)
class VerifyRequest:
    files: tuple[str, ...]
    trusted_keys: str | None = None  # explicit override: a trusted-keys list instead of the shipped root
    allow_unsigned: bool = False
    trust_root: str | None = None  # explicit override: a folder of trust metadata (1.root.json, targets.json)
    policy: Policy = field(default_factory=Policy)
    allow_unverified: bool = False  # accept records whose identities cannot be recomputed here
    project: str | None = None  # the checkout to recompute identities from (default: the current directory's, never the record's)
    now: datetime | None = None  # verification time (tests); default: the clock
    tsa_certs: tuple[str, ...] = ()  # PEM root certificates of trusted time-stamping authorities


@dataclass(frozen=True)
class FileVerification:
    path: str
    steps: tuple[StepResult, ...]
    record_identity: str | None = None
    subject: str | None = None
    subject_digest: str | None = None
    result: str | None = None
    verdict: str | None = None
    coverage: str | None = None
    signers: tuple[dict[str, str], ...] = ()
    identities: tuple[IdentityCheck, ...] = ()
    hardware: str | None = None
    builder: str | None = None
    policy_applied: bool = False
    #: the statement parsed from the payload bytes the signature covers (set once the schema step has run), so a
    #: reader of verified records uses what was verified instead of reading the file a second time
    statement: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return len(self.steps) == len(STEPS) and all(s.ok for s in self.steps)

    @property
    def unsigned(self) -> bool:
        return any(s.status == "accepted-unsigned" for s in self.steps)

    @property
    def status(self) -> str:
        if not self.ok:
            return "failed"
        if self.unsigned:
            return "unsigned"
        if any(s.status == "accepted-unverified" for s in self.steps):
            return "unverified"
        return "ok" if self.policy_applied else "authentic"

    def step(self, name: StepName) -> StepResult:
        return next(s for s in self.steps if s.step == name)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "status": self.status, "unsigned": self.unsigned,
                "record_identity": {"sha256": self.record_identity} if self.record_identity else None,
                "subject": self.subject, "subject_digest": self.subject_digest, "result": self.result,
                "verdict": self.verdict, "coverage": self.coverage, "hardware": self.hardware,
                "builder": self.builder, "signers": list(self.signers), "policy_applied": self.policy_applied,
                "steps": [s.to_json() for s in self.steps], "identities": [i.to_json() for i in self.identities]}


@dataclass(frozen=True)
class VerifyReport:
    trust: str
    trust_override: bool
    allow_unsigned: bool
    files: tuple[FileVerification, ...] = ()
    policy: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.files and all(f.ok for f in self.files) else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        return {"trust": self.trust, "trust_override": self.trust_override, "allow_unsigned": self.allow_unsigned,
                "policy": self.policy, "ok": self.exit_code == EXIT_OK, "files": [f.to_json() for f in self.files],
                "exit_code": self.exit_code}

    def lines(self) -> list[str]:
        """The text report; every string that came from a record is escaped for the terminal."""
        head = "TRUST OVERRIDE: " if self.trust_override else "trust: "
        out = [head + safe(self.trust)]
        for f in self.files:
            word = {"ok": "OK", "authentic": "AUTHENTIC", "unsigned": "UNSIGNED", "unverified": "UNVERIFIED",
                    "failed": "FAIL"}[f.status]
            extra = {"unsigned": "  (accepted by --allow-unsigned: nobody vouches for it)",
                     "unverified": "  (identities not recomputed; accepted by --allow-unverified)",
                     "authentic": "  (signed and consistent; no policy judged the result)"}.get(f.status, "")
            out.append(f"{word:<10} {safe(f.path)}{extra}")
            if f.subject is not None:
                out.append(f"    subject    {safe(f.subject)}  {safe((f.subject_digest or '')[:16])}…")
                out.append(f"    result     {safe(f.result)}  verdict {safe(f.verdict)}  ({safe(f.coverage)})")
            signer = ", ".join(f"{safe(s['owner'])} (key {s['keyid'][:16]}…)" for s in f.signers)
            out.append(f"    signer     {signer or ('none (unsigned)' if f.unsigned else 'none trusted')}")
            if f.hardware is not None:
                out.append(f"    hardware   {safe(f.hardware)} (self-reported); builder {safe(f.builder or 'not recorded')}")
            for s in f.steps:
                if s.status in ("pass", "not-applied") and s.step != "identities":
                    continue
                out.append(f"    {s.step:<11}{s.status:<20}{safe(s.message, 2000)}")
                for note in s.notes:
                    out.append(f"{'':31}{safe(note, 2000)}")
        out.append(f"exit code {self.exit_code}")
        return out


def load_trust(request: VerifyRequest) -> TrustRoot:
    """The shipped root unless an override is named; never anything from the current directory."""
    if request.trusted_keys and request.trust_root:
        raise GrpoConformError("verify: give either --trusted-keys or --trust-root, not both")
    if request.trusted_keys:
        keys = load_trusted_keys(request.trusted_keys)
        return TrustRoot(keys, f"keys from --trusted-keys {request.trusted_keys} (an unsigned list you chose; "
                         "the shipped trust root is NOT used)", True)
    if request.trust_root:
        return load_trust_root(request.trust_root, pinned=None, now=request.now)
    return load_trust_root(now=request.now)


def run_verify(request: VerifyRequest) -> VerifyReport:
    if not request.files:
        raise GrpoConformError("verify: no record files given")
    trust = load_trust(request)  # a broken trust root is a usage error (exit 2), not a bad record
    load_tsa_roots(request.tsa_certs)  # likewise a bad --tsa-cert
    return VerifyReport(trust.source, trust.override, request.allow_unsigned,
                        tuple(verify_file(f, trust.keys, request) for f in request.files),
                        request.policy.model_dump(exclude_defaults=True))


def _skipped(after: StepName, failed: StepName | None = None) -> list[StepResult]:
    rest = STEPS[STEPS.index(after) + 1:]
    return [StepResult(s, "skipped", f"not checked: the {failed or after} step failed") for s in rest]


def verify_file(path: str, trusted: tuple[TrustedKey, ...], request: VerifyRequest,
                ignore_signatures: bool = False) -> FileVerification:
    """`ignore_signatures`: everything but the signature (what `sign` checks before it signs)."""
    try:
        return _verify_file(path, trusted, request, ignore_signatures)
    except Exception as exc:  # one hostile file must never stop the report on the others
        return FileVerification(path, (StepResult("envelope", "fail", f"could not be verified: "
                                                  f"{type(exc).__name__}: {exc}"), *_skipped("envelope")))


def read_limited(path: str | Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The file's bytes, refusing anything but a regular file of at most `limit` bytes (never reads more)."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file")
    if info.st_size > limit:
        raise ValueError(f"{info.st_size} bytes; records over {limit} bytes are refused")
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"over {limit} bytes; refused")
    return data


def _verify_file(path: str, trusted: tuple[TrustedKey, ...], request: VerifyRequest,
                 ignore_signatures: bool) -> FileVerification:
    try:
        data = read_limited(path)
        envelope = parse_envelope(data, expected_type=None)
        if len(envelope.payload) > MAX_PAYLOAD_BYTES:
            raise EnvelopeError(f"payload of {len(envelope.payload)} bytes; over {MAX_PAYLOAD_BYTES} is refused")
    except OSError as exc:
        return FileVerification(path, (StepResult("envelope", "fail", f"cannot read the file: {exc.strerror}"),
                                       *_skipped("envelope")))
    except (ValueError, EnvelopeError) as exc:
        return FileVerification(path, (StepResult("envelope", "fail", str(exc)), *_skipped("envelope")))
    if envelope.payload_type != PAYLOAD_TYPE:
        steps = [StepResult("envelope", "fail", wrong_type(envelope.payload_type))]
    else:
        steps = [StepResult("envelope", "pass", f"DSSE envelope, {len(envelope.signatures)} signature(s)")]
    now = request.now or datetime.now(timezone.utc)
    if ignore_signatures:
        envelope = Envelope(envelope.payload_type, envelope.payload, ())
    token = None
    if token_path(path).is_file():
        try:
            token = read_limited(token_path(path), MAX_TOKEN_BYTES)
        except (OSError, ValueError) as exc:
            return FileVerification(path, (StepResult("envelope", "fail", f"{token_path(path)}: {exc}"),
                                           *_skipped("envelope")))
    signature, payload, signers = signature_step(envelope, trusted, request.allow_unsigned or ignore_signatures, now,
                                                 token, load_tsa_roots(request.tsa_certs))
    steps.append(signature)
    if payload is None or not steps[0].ok:
        failed: StepName = "envelope" if not steps[0].ok else "signature"
        return FileVerification(path, tuple(steps + _skipped("signature", failed)), signers=signers)
    record_identity = sha256_hex(payload)
    done = dict(record_identity=record_identity, signers=signers)
    try:
        statement = loads_strict(payload)
    except ValueError as exc:
        steps.append(StepResult("schema", "fail", f"the payload is not strict JSON: {exc}"))
        return FileVerification(path, tuple(steps + _skipped("schema")), **done)
    problems = schema_problems(statement)
    schema = schema_file_for(statement)
    if problems:
        steps.append(StepResult("schema", "fail", f"breaks {schema}: {problems[0]}", tuple(problems[1:20])))
        return FileVerification(path, tuple(steps + _skipped("schema")), **done)
    steps.append(StepResult("schema", "pass", f"valid against {schema}"))
    done["statement"] = statement
    problems = [p for p in (canonical_problem(payload, statement),) if p] + semantic_problems(statement)
    problems += spec_problems(statement, project_root_for(None, request.project))
    problems += [p for p in (future_problem(statement, now),) if p]
    if problems:
        steps.append(StepResult("semantics", "fail", problems[0], tuple(problems[1:20])))
        return FileVerification(path, tuple(steps + _skipped("semantics")), **done)
    steps.append(StepResult("semantics", "pass", "canonical, one subject, result and verdict follow from the checks"))
    predicate = statement["predicate"]
    subject = statement["subject"][0]
    device = predicate["hardware"].get("device", {})
    done.update(subject=subject["name"], subject_digest=next(iter(subject["digest"].values())),
                result=predicate["result"], verdict=predicate["verdict"], coverage=coverage_phrase(predicate),
                hardware=str(device.get("name", device.get("kind", "?"))),
                builder=(predicate["run"].get("builder") or {}).get("id"))
    checks = identity_checks(statement, Path(path), request.project)
    steps.append(identities_step(checks, record_identity, request.allow_unverified))
    if not steps[-1].ok:
        return FileVerification(path, tuple(steps + _skipped("identities")), identities=checks, **done)
    if request.policy.is_empty():
        steps.append(StepResult("policy", "not-applied", "no policy: the result is shown, not judged "
                                "(use --require-result PASSED or --policy FILE)"))
        return FileVerification(path, tuple(steps), identities=checks, **done)
    broken = policy_problems(request.policy, statement, signers, now)
    steps.append(StepResult("policy", "fail", broken[0], tuple(broken[1:])) if broken
                 else StepResult("policy", "pass", "meets the policy"))
    return FileVerification(path, tuple(steps), identities=checks, policy_applied=True, **done)


def identity_checks(statement: dict[str, Any], record: Path | None, project: str | None) -> tuple[IdentityCheck, ...]:
    root = project_root_for(record, project)
    predicate = statement["predicate"]
    spec_descriptor = next((d for d in predicate["configuration"] if d["name"].startswith("spec:")), {})
    return (implementation_check(statement, root),
            *spec_checks(statement, root, spec_descriptor.get("uri"), predicate["spec"].get("file_sha256")))


def identities_step(checks: tuple[IdentityCheck, ...], record_identity: str, allow_unverified: bool) -> StepResult:
    notes = (f"record identity sha256 {record_identity}", *(c.describe() for c in checks))
    differs = [c for c in checks if c.status == "differs"]
    unverified = [c for c in checks if c.status == "unverified"]
    if differs:
        return StepResult("identities", "fail", differs[0].describe(), notes)
    if unverified:
        if allow_unverified:
            return StepResult("identities", "accepted-unverified", f"{len(unverified)} identit(y/ies) not recomputed, "
                              "accepted by --allow-unverified", notes)
        return StepResult("identities", "unverified", f"{unverified[0].describe()}; nothing vouches that the record "
                          "names what it says (pass --project DIR, or --allow-unverified)", notes)
    impl = next((c for c in checks if c.kind == "implementation"), None)
    how = "; implementation " + impl.source if impl is not None and impl.status == "match-commit" else ""
    return StepResult("identities", "pass", "recomputed and equal" + how, notes)
