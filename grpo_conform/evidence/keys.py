"""Ed25519 keys: generating a pair, loading the signing key, and the committed trusted-keys list.

Key id = sha256 (lowercase hex) of the public key's DER SubjectPublicKeyInfo, the same value as
`openssl pkey -pubin -in KEY.pub.pem -outform DER | sha256sum`. A key id in an envelope is only a
hint: trust comes from the trusted-keys list and from a signature that verifies.

The signing key is found the way CI systems hand out secrets: an explicit path, else the PEM
itself in $GRPO_CONFORM_SIGNING_KEY, else a path in $GRPO_CONFORM_SIGNING_KEY_FILE. No key means
an unsigned record, which `verify` rejects unless told to accept unsigned records.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from grpo_conform.canonical import sha256_hex
from grpo_conform.errors import EXIT_OK, GrpoConformError

ENV_SIGNING_KEY = "GRPO_CONFORM_SIGNING_KEY"
ENV_SIGNING_KEY_FILE = "GRPO_CONFORM_SIGNING_KEY_FILE"
TRUSTED_KEYS_FORMAT = "grpo-conform/trusted-keys/v1"
#: The committed list, relative to the project root.
DEFAULT_TRUSTED_KEYS = Path("evidence") / "keys" / "trusted-keys.json"


class SigningKeyError(GrpoConformError):
    """A private or public key file (or variable) that cannot be used; says which and what was expected."""


class TrustedKeysError(GrpoConformError):
    """A trusted-keys list that cannot be read or contradicts its own key files."""

    def __init__(self, file: str | Path, problem: str):
        self.file, self.problem = str(file), problem
        super().__init__(f"{file}: {problem}")


def keyid_of(public_key: Ed25519PublicKey) -> str:
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return sha256_hex(der)


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class SigningKey:
    """A loaded private key with its key id and where it came from (a file or a variable, never the key)."""

    private_key: Ed25519PrivateKey
    keyid: str
    source: str

    @classmethod
    def of(cls, private_key: "Ed25519PrivateKey | SigningKey", source: str = "in memory") -> "SigningKey":
        if isinstance(private_key, SigningKey):
            return private_key
        if not isinstance(private_key, Ed25519PrivateKey):
            raise SigningKeyError(f"a {type(private_key).__name__} cannot sign records; expected an Ed25519 key")
        return cls(private_key, keyid_of(private_key.public_key()), source)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()


# -- generating -----------------------------------------------------------------------------
@dataclass(frozen=True)
class KeygenRequest:
    private_key: str
    public_key: str


@dataclass(frozen=True)
class KeygenReport:
    private_key: str
    public_key: str
    keyid: str

    @property
    def exit_code(self) -> int:
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"private_key": self.private_key, "public_key": self.public_key, "keyid": self.keyid}


def keygen(private_path: str | Path, public_path: str | Path) -> str:
    """Write a new Ed25519 pair (private: PKCS#8 PEM, mode 0600; public: SPKI PEM); return its key id."""
    private_path, public_path = Path(private_path), Path(public_path)
    if private_path.resolve() == public_path.resolve():
        raise SigningKeyError(f"{private_path}: the private and the public key need two different files")
    for p in (private_path, public_path):
        if p.exists() or p.is_symlink():
            raise SigningKeyError(f"{p}: already exists; keygen never overwrites a key (remove it or choose "
                                  "another path)")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    _create(private_path, private_pem, 0o600)
    try:
        _create(public_path, public_pem(key.public_key()), 0o644)
    except BaseException:
        private_path.unlink(missing_ok=True)  # never leave half a pair behind
        raise
    return keyid_of(key.public_key())


def _create(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: refuse to follow or replace anything created meanwhile; the mode applies from birth.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise SigningKeyError(f"{path}: already exists; keygen never overwrites a key") from None
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot create: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # the umask may have narrowed it; 0600 stays 0600 either way


def run_keygen(request: KeygenRequest) -> KeygenReport:
    keyid = keygen(request.private_key, request.public_key)
    return KeygenReport(request.private_key, request.public_key, keyid)


# -- loading --------------------------------------------------------------------------------
def parse_private_key(pem: bytes, where: str) -> Ed25519PrivateKey:
    if b"ENCRYPTED" in pem:
        raise SigningKeyError(f"{where}: the key is encrypted; expected an unencrypted PKCS#8 PEM Ed25519 key "
                              "(keep it secret through the CI's secret store instead)")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise SigningKeyError(f"{where}: not a PEM private key; expected a PKCS#8 PEM Ed25519 key "
                              "('-----BEGIN PRIVATE KEY-----', as written by `grpo-conform keygen`)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{where}: a {type(key).__name__}; expected an Ed25519 key")
    return key


def load_private_key_file(path: str | Path) -> SigningKey:
    path = Path(path)
    try:
        pem = path.read_bytes()
    except FileNotFoundError:
        raise SigningKeyError(f"{path}: signing key file not found; expected a PKCS#8 PEM Ed25519 private key") \
            from None
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read the signing key: {exc.strerror}") from None
    return SigningKey.of(parse_private_key(pem, str(path)), f"file {path}")


def load_signing_key(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The key to sign with: `path`, else $GRPO_CONFORM_SIGNING_KEY (PEM), else $..._FILE (a path); else None."""
    env = os.environ if environ is None else environ
    if path is not None:
        return load_private_key_file(path)
    pem = env.get(ENV_SIGNING_KEY, "")
    if pem.strip():
        # Some CI secret stores flatten newlines into a literal backslash-n; PEM needs real ones.
        if "\n" not in pem.strip() and "\\n" in pem:
            pem = pem.replace("\\n", "\n")
        key = parse_private_key(pem.encode(), f"environment variable {ENV_SIGNING_KEY}")
        return SigningKey.of(key, f"environment variable {ENV_SIGNING_KEY}")
    file = env.get(ENV_SIGNING_KEY_FILE, "")
    if file.strip():
        if not Path(file).is_file():
            raise SigningKeyError(f"environment variable {ENV_SIGNING_KEY_FILE} names {file!r}, which is not a "
                                  "file; expected the path of a PKCS#8 PEM Ed25519 private key")
        loaded = load_private_key_file(file)
        return SigningKey(loaded.private_key, loaded.keyid, f"file {file} (from {ENV_SIGNING_KEY_FILE})")
    return None


def load_public_key_file(path: str | Path) -> Ed25519PublicKey:
    path = Path(path)
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read the public key: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm):
        raise SigningKeyError(f"{path}: not a PEM public key; expected an Ed25519 SubjectPublicKeyInfo PEM "
                              "('-----BEGIN PUBLIC KEY-----')") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path}: a {type(key).__name__}; expected an Ed25519 public key")
    return key


# -- trusted keys ---------------------------------------------------------------------------
def parse_time(value: str) -> datetime:
    """An RFC 3339 UTC time ending in Z (the only form records and key lists use)."""
    if not isinstance(value, str) or not value.endswith("Z"):
        raise ValueError(f"expected an RFC 3339 UTC time ending in Z, got {value!r}")
    parsed = datetime.fromisoformat(value[:-1] + "+00:00")  # Python 3.10 does not read a trailing Z
    return parsed.astimezone(timezone.utc)


@dataclass(frozen=True)
class TrustedKey:
    keyid: str
    public_key: Ed25519PublicKey
    public_key_file: str
    owner: str
    valid_from: datetime
    valid_until: datetime | None
    revoked: bool
    revoked_reason: str | None = None

    def window(self) -> str:
        end = self.valid_until.strftime("%Y-%m-%dT%H:%M:%SZ") if self.valid_until else "no end"
        return f"{self.valid_from.strftime('%Y-%m-%dT%H:%M:%SZ')} .. {end}"

    def valid_at(self, when: datetime) -> bool:
        return self.valid_from <= when and (self.valid_until is None or when < self.valid_until)


_ENTRY_FIELDS = {"keyid", "public_key", "owner", "valid_from", "valid_until", "revoked", "revoked_reason"}


def load_trusted_keys(path: str | Path) -> tuple[TrustedKey, ...]:
    """Read a trusted-keys list; each public key file is loaded and must hash to its listed key id."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrustedKeysError(path, "trusted-keys list not found; pass --trusted-keys FILE "
                               f"(the project's is {DEFAULT_TRUSTED_KEYS})") from None
    except OSError as exc:
        raise TrustedKeysError(path, f"cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TrustedKeysError(path, f"not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != TRUSTED_KEYS_FORMAT or not isinstance(doc.get("keys"), list):
        raise TrustedKeysError(path, f'expected {{"format": "{TRUSTED_KEYS_FORMAT}", "keys": [...]}} '
                               "(see docs/evidence.md, Key management)")
    keys = tuple(_trusted_entry(path, i, entry) for i, entry in enumerate(doc["keys"]))
    seen: set[str] = set()
    for i, key in enumerate(keys):
        if key.keyid in seen:  # two entries for one key would make revocation ambiguous
            raise TrustedKeysError(path, f"keys[{i}]: key {key.keyid} is listed twice; keep one entry per key")
        seen.add(key.keyid)
    return keys


def _trusted_entry(file: Path, index: int, entry: Any) -> TrustedKey:
    where = f"keys[{index}]"
    if not isinstance(entry, dict):
        raise TrustedKeysError(file, f"{where}: expected an object")
    unknown = set(entry) - _ENTRY_FIELDS
    if unknown:
        raise TrustedKeysError(file, f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_ENTRY_FIELDS)}")
    for name, kind in (("keyid", str), ("public_key", str), ("owner", str), ("valid_from", str), ("revoked", bool)):
        if not isinstance(entry.get(name), kind):
            raise TrustedKeysError(file, f"{where}.{name}: missing or not a {kind.__name__}")
    if entry.get("valid_until") is not None and not isinstance(entry["valid_until"], str):
        raise TrustedKeysError(file, f"{where}.valid_until: expected an RFC 3339 time or null")
    try:
        valid_from = parse_time(entry["valid_from"])
        valid_until = parse_time(entry["valid_until"]) if entry.get("valid_until") else None
    except ValueError as exc:
        raise TrustedKeysError(file, f"{where}: {exc}") from None
    key_file = file.parent / entry["public_key"]  # relative to the list, so the folder can move as a whole
    try:
        public_key = load_public_key_file(key_file)
    except SigningKeyError as exc:
        raise TrustedKeysError(file, f"{where}.public_key: {exc}") from None
    actual = keyid_of(public_key)
    if actual != entry["keyid"].lower():
        raise TrustedKeysError(file, f"{where}.keyid: listed {entry['keyid']}, but {key_file} has key id {actual}")
    return TrustedKey(actual, public_key, str(key_file), entry["owner"], valid_from, valid_until,
                      entry["revoked"], entry.get("revoked_reason"))
