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
from grpo_conform.evidence.dsse import Envelope, EnvelopeError, make_envelope, parse_envelope
from grpo_conform.evidence.keys import ENV_SIGNING_KEY, ENV_SIGNING_KEY_FILE, SigningKey, SigningKeyError, \
    load_signing_key
from grpo_conform.evidence.statement import StatementError, build_statement, check_statement, statement_bytes


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


def write_record(statement: dict[str, Any], path: str | Path,
                 private_key: SigningKey | Ed25519PrivateKey | None) -> WrittenRecord:
    """Check `statement` against the schema, sign it (if a key is given) and write the envelope atomically.

    Without a key the record has `"signatures": []`; `WrittenRecord.signed` is then False and the
    caller must say loudly that the record is unsigned.
    """
    check_statement(statement)  # never publish a record that `verify` would reject as malformed
    payload = statement_bytes(statement)
    envelope = make_envelope(payload, SigningKey.of(private_key) if private_key is not None else None)
    try:
        atomic_write(path, envelope_text(envelope))
    except OSError as exc:
        raise RecordError(path, f"cannot write the record: {exc.strerror}") from None
    predicate = statement["predicate"]
    return WrittenRecord(str(path), statement["subject"][0]["name"], sha256_hex(payload),
                         tuple(s.keyid for s in envelope.signatures), predicate["result"], predicate["verdict"])


def record_filename(impl_name: str, device: str = "", finished: str = "", identity: str = "") -> str:
    """`<implementation>--<device>--<UTC time>--<identity prefix>.intoto.json`: one record per
    implementation, hardware and run; the identity prefix keeps two folders of one name apart."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    stamp = finished.replace("-", "").replace(":", "")
    return "--".join(x for x in (impl_name, slug, stamp, identity[:12]) if x) + ".intoto.json"


def write_evidence(report: Any, directory: str | Path,
                   private_key: SigningKey | Ed25519PrivateKey | None) -> tuple[WrittenRecord, ...]:
    """One record per implementation of a CheckReport, named by `record_filename`."""
    statements = [(impl, build_statement(report, impl)) for impl in report.implementations]
    for _, statement in statements:  # all or nothing: check every statement before writing any
        check_statement(statement)
    device = report.device.get("name", report.device.get("kind", ""))
    written: dict[Path, WrittenRecord] = {}
    for impl, statement in statements:  # the same folder named twice in one run gets one record
        path = Path(directory) / record_filename(impl.name, device, report.finished, impl.identity)
        if path not in written:
            written[path] = write_record(statement, path, private_key)
    return tuple(written.values())


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


def _signable(path: str | Path) -> tuple[Envelope, dict[str, Any]]:
    envelope = read_envelope(path)
    try:
        statement = json.loads(envelope.payload)
        check_statement(statement)  # a signature vouches for the content: refuse to sign a malformed one
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(path, f"the payload is not JSON ({exc}); refusing to sign it") from None
    except StatementError as exc:
        raise RecordError(path, f"refusing to sign: {exc}") from None
    return envelope, statement


def sign_record(path: str | Path, private_key: SigningKey | Ed25519PrivateKey) -> WrittenRecord:
    """Add a signature by `private_key` to the record at `path`; the payload bytes stay exactly as they are."""
    envelope, statement = _signable(path)
    signed = envelope.signed_by(SigningKey.of(private_key))
    if signed is not envelope:  # already signed by this key: leave the file untouched
        try:
            atomic_write(path, envelope_text(signed))
        except OSError as exc:
            raise RecordError(path, f"cannot write the signed record: {exc.strerror}") from None
    predicate = statement["predicate"]
    return WrittenRecord(str(path), statement["subject"][0]["name"], sha256_hex(envelope.payload),
                         tuple(s.keyid for s in signed.signatures), predicate["result"], predicate["verdict"])


# -- `grpo-conform sign FILE... [--key PATH]` ---------------------------------------------------
@dataclass(frozen=True)
class SignRequest:
    files: tuple[str, ...]
    key_path: str | None = None  # else $GRPO_CONFORM_SIGNING_KEY, else $GRPO_CONFORM_SIGNING_KEY_FILE


@dataclass(frozen=True)
class SignReport:
    keyid: str
    key_source: str
    records: tuple[WrittenRecord, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"keyid": self.keyid, "key_source": self.key_source, "records": [r.to_json() for r in self.records]}


def run_sign(request: SignRequest) -> SignReport:
    key = load_signing_key(request.key_path)
    if key is None:
        raise SigningKeyError(f"no signing key: pass --key FILE, or set {ENV_SIGNING_KEY} (the PEM itself) or "
                              f"{ENV_SIGNING_KEY_FILE} (its path)")
    if not request.files:
        raise RecordError("sign", "no record files given")
    for f in request.files:  # check every record first, so one bad file signs nothing
        _signable(f)
    return SignReport(key.keyid, key.source, tuple(sign_record(f, key) for f in request.files))
