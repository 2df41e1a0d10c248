"""Writing trust-root metadata (used by tools/trust-root.py and by the tests' throw-away roots).

Private keys are passed in by the caller (loaded from files outside the repository); only the
signed metadata is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import DelegatedRole, Delegations, Key, Metadata, Role, Root, Targets
from tuf.api.serialization.json import JSONSerializer

from grpo_conform.evidence.keys import keyid_of
from grpo_conform.evidence.trust import EVIDENCE_ROLE, FIELD


@dataclass(frozen=True)
class EvidenceKey:
    public_key: Ed25519PublicKey
    owner: str
    valid_from: str
    valid_until: str | None = None
    revoked: bool = False
    revoked_reason: str | None = None


def tuf_key(public: Ed25519PublicKey) -> SSlibKey:
    """A TUF key whose id is our key id (sha256 of the DER SubjectPublicKeyInfo)."""
    return SSlibKey.from_crypto(public, keyid=keyid_of(public))


def _signer(private: Ed25519PrivateKey) -> CryptoSigner:
    return CryptoSigner(private, tuf_key(private.public_key()))


def _stamp(when: datetime) -> datetime:
    return when.replace(microsecond=0)


def build_root(version: int, root_keys: Sequence[Ed25519PublicKey], threshold: int, expires: datetime,
               targets_keys: Sequence[Ed25519PublicKey] | None = None, targets_threshold: int | None = None
               ) -> Metadata[Root]:
    targets_keys = list(targets_keys or root_keys)
    keys = {k.keyid: k for k in (tuf_key(p) for p in [*root_keys, *targets_keys])}
    root_ids = [keyid_of(p) for p in root_keys]
    roles = {
        Root.type: Role(root_ids, threshold),
        Targets.type: Role([keyid_of(p) for p in targets_keys], targets_threshold or threshold),
        # Required by TUF's Root; unused without a repository to update from (the package is the snapshot).
        "snapshot": Role(root_ids, threshold),
        "timestamp": Role(root_ids, threshold),
    }
    return Metadata(Root(version=version, expires=_stamp(expires), keys=keys, roles=roles, consistent_snapshot=False))


def build_targets(version: int, evidence: Iterable[EvidenceKey], expires: datetime) -> Metadata[Targets]:
    keys: dict[str, Key] = {}
    active: list[str] = []
    for e in evidence:
        k = tuf_key(e.public_key)
        fields = {FIELD + "owner": e.owner, FIELD + "valid-from": e.valid_from}
        if e.valid_until:
            fields[FIELD + "valid-until"] = e.valid_until
        if e.revoked:
            fields[FIELD + "revoked"] = True
            fields[FIELD + "revoked-reason"] = e.revoked_reason or "revoked"
        else:
            active.append(k.keyid)
        k.unrecognized_fields.update(fields)
        keys[k.keyid] = k
    role = DelegatedRole(EVIDENCE_ROLE, active, 1, True, paths=["*"])
    return Metadata(Targets(version=version, expires=_stamp(expires),
                            delegations=Delegations(keys, roles={EVIDENCE_ROLE: role})))


def sign_metadata(md: Metadata, private_keys: Iterable[Ed25519PrivateKey]) -> Metadata:
    for key in private_keys:
        md.sign(_signer(key), append=True)
    return md


def write_metadata(md: Metadata, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data = md.to_bytes(JSONSerializer(compact=False))
    Path(path).write_bytes(data + b"\n")


def load_private(path: str | Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: expected an Ed25519 private key")
    return key


def load_public(path: str | Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: expected an Ed25519 public key")
    return key


def root_versions(folder: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in folder.glob("*.root.json") if p.name.split(".")[0].isdigit())


def targets_version(folder: Path) -> int:
    try:
        return int(json.loads((folder / "targets.json").read_text())["signed"]["version"])
    except (OSError, ValueError, KeyError):
        return 0
