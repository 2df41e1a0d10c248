"""Writing records (signed or loudly unsigned) and signing records written elsewhere.

A record is a DSSE envelope in a JSON file. Files are replaced atomically (temporary file in the
same folder, fsync, rename), so a crash or a full disk never leaves half a record behind.
`sign_record` exists for records made on a machine that must not hold the key (a rented GPU):
the payload is kept byte for byte, only a signature is added.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from grpo_conform.canonical import sha256_hex
from grpo_conform.errors import EXIT_OK, GrpoConformError
from grpo_conform.evidence.dsse import Envelope, EnvelopeError, json_int, make_envelope, parse_envelope, verify_signature
from grpo_conform.evidence.keys import ENV_SIGNING_KEY, ENV_SIGNING_KEY_FILE, SigningKey, SigningKeyError, \
    load_signing_key
from grpo_conform.evidence.semantics import semantic_problems
from grpo_conform.evidence.statement import StatementError, build_statement, check_statement, statement_bytes
from grpo_conform.evidence.terminal import safe
from grpo_conform.evidence.timestamps import timestamp_query
from grpo_conform.evidence.trust import load_trust_root
from grpo_conform.evidence.verify import VerifyRequest, verify_file


class RecordError(GrpoConformError):
    """A record file that cannot be read, parsed or replaced."""

    def __init__(self, file: str | Path, problem: str):
        self.file, self.problem = str(file), problem
        super().__init__(f"{file}: {problem}")


@dataclass(frozen=True)
class WrittenRecord:
    """What was written: `signed` False means the caller must say loudly that the record is unsigned."""

    path: str
    subject: str
    record_identity: str  # sha256 of the payload bytes
    keyids: tuple[str, ...]
    result: str
    verdict: str
    changed: bool = True  # False: `sign` found this key's signature already there and left the file alone

    @property
    def signed(self) -> bool:
        return bool(self.keyids)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "subject": self.subject, "record_identity": {"sha256": self.record_identity},
                "signed": self.signed, "keyids": list(self.keyids), "result": self.result, "verdict": self.verdict}


def envelope_text(envelope: Envelope) -> str:
    # The envelope's JSON is not signed (the PAE is), so it is written readable.
    return json.dumps(envelope.to_json(), indent=2) + "\n"


def atomic_write(path: str | Path, text: str, mode: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_publishable(statement: dict[str, Any]) -> bytes:
    """The payload bytes of `statement`, or a StatementError for what `verify` would refuse in it."""
    check_statement(statement)  # never publish a record that `verify` would reject as malformed
    problems = semantic_problems(statement)
    if problems:
        raise StatementError(f"the statement contradicts itself: {problems[0]}")
    return statement_bytes(statement)


def write_record(statement: dict[str, Any], path: str | Path,
                 private_key: SigningKey | Ed25519PrivateKey | None) -> WrittenRecord:
    """Check `statement` (schema and semantics), sign it (if a key is given) and write the envelope atomically.

    Without a key the record has `"signatures": []`; `WrittenRecord.signed` is then False and the
    caller must say loudly that the record is unsigned.
    """
    payload = check_publishable(statement)
    envelope = make_envelope(payload, SigningKey.of(private_key) if private_key is not None else None)
    try:
        atomic_write(path, envelope_text(envelope))
    except OSError as exc:
        raise RecordError(path, f"cannot write the record: {exc.strerror}") from None
    predicate = statement["predicate"]
    return WrittenRecord(str(path), statement["subject"][0]["name"], sha256_hex(payload),
                         tuple(s.keyid for s in envelope.signatures), predicate["result"], predicate["verdict"])


def record_filename(impl_name: str, device: str = "", finished: str = "", identity: str = "", member: str = "") -> str:
    """`<implementation>[--<member>]--<device>--<UTC time>--<identity prefix>.intoto.json`: one record per
    implementation, member, hardware and run; the identity prefix keeps two folders of one name apart."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    stamp = finished.replace("-", "").replace(":", "")
    member = re.sub(r"[^a-z0-9]+", "-", member.lower()).strip("-")
    return "--".join(x for x in (impl_name, member, slug, stamp, identity[:12]) if x) + ".intoto.json"


def decided_elsewhere(member: Any) -> bool:
    """A member this report ran nothing of, every workload left to another slot or shard (`--jobs`,
    `--gpus`, `--shard`): the report says nothing about it, so it gets no record from this report.
    (Recording it would state 'conformant' on no check: `verify` refuses such a record.)"""
    if member is None or getattr(member, "workloads", ()):
        return False
    not_run = tuple(getattr(getattr(member, "coverage", None), "not_run", ()) or ())
    elsewhere = [n for n in not_run if n.kind == "elsewhere"]
    return bool(elsewhere) and all(n.kind in ("elsewhere", "deselected") for n in not_run)


def statements_of(report: Any) -> list[tuple[Any, Any, dict[str, Any]]]:
    """(implementation, member or None, statement): one per implementation x member (issue 13), or one
    per implementation when the result has no members; members decided elsewhere left out."""
    out = []
    for impl in report.implementations:
        members = tuple(getattr(impl, "members", ()) or ())
        for member in members or (None,):
            if not decided_elsewhere(member):
                out.append((impl, member, build_statement(report, impl, member)))
    return out


def write_evidence(report: Any, directory: str | Path,
                   private_key: SigningKey | Ed25519PrivateKey | None) -> tuple[WrittenRecord, ...]:
    """One record per implementation (x member) of a CheckReport, named by `record_filename`.

    A report run in slots (`--jobs`, `--gpus`: `report.parts`) gets one record per slot report and
    member it ran, each naming the device and measured ceilings of its own slot. All or nothing:
    every statement of every part is checked before any is written. Two slot reports of one
    implementation x member that finished in the same second get distinct names (`-2`, `-3`, ...
    after the identity prefix); the same folder named twice in one report gets one record."""
    parts = tuple(getattr(report, "parts", ()) or ()) or (report,)
    planned: list[tuple[Path, dict[str, Any]]] = []
    taken: dict[Path, int] = {}
    for part in parts:
        device = part.device.get("name", part.device.get("kind", ""))
        mine: set[Path] = set()
        for impl, member, statement in statements_of(part):
            check_publishable(statement)
            name = getattr(getattr(member, "spec", None), "member", None) or "" if member is not None else ""
            path = Path(directory) / record_filename(impl.name, device, part.finished, impl.identity, name)
            if path in mine:
                continue
            mine.add(path)
            n = taken[path] = taken.get(path, 0) + 1
            if n > 1:  # another slot's record of this implementation x member, finished in the same second
                path = path.with_name(f"{path.name[: -len('.intoto.json')]}-{n}.intoto.json")
            planned.append((path, statement))
    return tuple(write_record(statement, path, private_key) for path, statement in planned)


@dataclass(frozen=True)
class SignRequest:
    files: tuple[str, ...]
    key_path: str | None = None  # else $GRPO_CONFORM_SIGNING_KEY, else $GRPO_CONFORM_SIGNING_KEY_FILE
    project: str | None = None  # the checkout identities are recomputed from (default: the current directory's)
    allow_unverified: bool = False  # sign records whose identities cannot be recomputed here
    dry_run: bool = False  # check and show, sign nothing
    timestamp_query: bool = False  # also write <record>.tsq: the RFC 3161 query for the new signature


@dataclass(frozen=True)
class ToSign:
    """What `sign` is about to vouch for: shown before (and reported after) signing."""

    path: str
    subject: str
    subject_digest: str
    result: str
    verdict: str
    coverage: str
    hardware: str
    builder: str | None
    record_identity: str
    identities: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "subject": self.subject, "subject_digest": self.subject_digest,
                "result": self.result, "verdict": self.verdict, "coverage": self.coverage,
                "hardware": self.hardware, "builder": self.builder,
                "record_identity": {"sha256": self.record_identity}, "identities": list(self.identities)}


@dataclass(frozen=True)
class SignReport:
    keyid: str
    key_source: str
    key_trusted: str  # whether the shipped trust root names this key, in words
    planned: tuple[ToSign, ...]
    records: tuple[WrittenRecord, ...]
    dry_run: bool = False

    @property
    def exit_code(self) -> int:
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"keyid": self.keyid, "key_source": self.key_source, "key_trusted": self.key_trusted,
                "dry_run": self.dry_run, "planned": [p.to_json() for p in self.planned],
                "records": [r.to_json() for r in self.records]}

    def lines(self) -> list[str]:
        out = [f"signing key {self.keyid[:16]}… from {safe(self.key_source)}: {self.key_trusted}"]
        unchanged = {r.path for r in self.records if not r.changed}
        for p in self.planned:
            verb = "would sign" if self.dry_run else "signed"
            if p.path in unchanged:
                verb = "already signed by this key, unchanged:"
            out.append(f"{verb} {safe(p.path)}")
            out.append(f"    subject    {safe(p.subject)}  {p.subject_digest[:16]}…")
            out.append(f"    result     {safe(p.result)}  verdict {safe(p.verdict)}  ({safe(p.coverage)})")
            out.append(f"    hardware   {safe(p.hardware)} (self-reported); builder {safe(p.builder or 'not recorded')}")
            for note in p.identities:
                out.append(f"    identity   {safe(note, 2000)}")
        return out


def preflight(path: str, request: SignRequest) -> ToSign:
    """Everything `verify` checks but the signature; a RecordError naming the first refusal."""
    result = verify_file(path, (), VerifyRequest((path,), project=request.project,
                                                  allow_unverified=request.allow_unverified), ignore_signatures=True)
    bad = [s for s in result.steps if not s.ok and s.status != "skipped"]
    if bad:
        step = bad[0]
        raise RecordError(path, f"refusing to sign: {step.step} {step.status}: {safe(step.message, 2000)}")
    notes = next(s for s in result.steps if s.step == "identities").notes
    return ToSign(path, result.subject or "", result.subject_digest or "", result.result or "", result.verdict or "",
                  result.coverage or "", result.hardware or "", result.builder, result.record_identity or "",
                  tuple(notes))


def read_envelope(path: str | Path) -> Envelope:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise RecordError(path, "no such record file") from None
    except OSError as exc:
        raise RecordError(path, f"cannot read: {exc.strerror}") from None
    try:
        return parse_envelope(data)
    except EnvelopeError as exc:
        raise RecordError(path, f"not a grpo-conform record: {exc}") from None


def sign_record(path: str | Path, private_key: SigningKey | Ed25519PrivateKey) -> WrittenRecord:
    """Add a signature by `private_key` to the record at `path`; the payload bytes stay exactly as they are.

    The caller checks the record first (`preflight`); this only refuses what is not an envelope.
    """
    envelope = read_envelope(path)
    statement = json.loads(envelope.payload, parse_int=json_int)
    signed = envelope.signed_by(SigningKey.of(private_key))
    if signed is not envelope:  # already signed by this key: leave the file untouched
        try:
            atomic_write(path, envelope_text(signed))
        except OSError as exc:
            raise RecordError(path, f"cannot write the signed record: {exc.strerror}") from None
    predicate = statement["predicate"]
    return WrittenRecord(str(path), statement["subject"][0]["name"], sha256_hex(envelope.payload),
                         tuple(s.keyid for s in signed.signatures), predicate["result"], predicate["verdict"],
                         signed is not envelope)


def _key_standing(keyid: str) -> str:
    try:
        keys = {k.keyid: k for k in load_trust_root().keys}
    except GrpoConformError as exc:
        return f"the shipped trust root cannot be read ({exc})"
    key = keys.get(keyid)
    if key is None:
        return "NOT named by the shipped trust root: `verify` will refuse these signatures"
    if key.revoked:
        return f"REVOKED in the shipped trust root ({key.revoked_reason})"
    return f"an evidence key of the shipped trust root ({key.owner}, valid {key.window()})"


# -- `grpo-conform sign FILE... [--key PATH]` ---------------------------------------------------
def run_sign(request: SignRequest) -> SignReport:
    key = load_signing_key(request.key_path)
    if key is None:
        raise SigningKeyError(f"no signing key: pass --key FILE, or set {ENV_SIGNING_KEY} (the PEM itself) or "
                              f"{ENV_SIGNING_KEY_FILE} (its path)")
    if not request.files:
        raise RecordError("sign", "no record files given")
    planned = tuple(preflight(f, request) for f in request.files)  # one refused file signs nothing
    records = () if request.dry_run else tuple(sign_record(f, key) for f in request.files)
    if request.timestamp_query and not request.dry_run:
        for f in request.files:  # the query covers this key's signature bytes
            env = read_envelope(f)
            sig = next(s.sig for s in env.signatures if verify_signature(key.public_key, env.pae, s.sig))
            Path(f + ".tsq").write_bytes(timestamp_query(sig))
    return SignReport(key.keyid, key.source, _key_standing(key.keyid), planned, records, request.dry_run)
