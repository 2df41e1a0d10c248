"""The root of trust: which keys may sign evidence, shipped with the package and signed offline.

The trust root is TUF metadata (python-tuf's `tuf.api.metadata`), installed as package data under
`grpo_conform/evidence/trust/`:

- `1.root.json`, `2.root.json`, ...: the root chain. Version 1 must be signed by the root keys
  pinned in this module (`PINNED_ROOT_KEYIDS`) up to its threshold; every later version by a
  threshold of the previous version's root keys AND of its own (TUF's rotation rule). The last
  version must not have expired.
- `targets.json`: signed by a threshold of the targets keys the final root names. It delegates the
  role `evidence` to the online evidence-signing keys; each delegated key carries its owner and
  validity window (`x-grpo-conform-*` fields). A key is revoked by removing it from the role's
  keyids (it may stay listed, marked revoked, so the verifier can say why).

Rollback: the root and targets versions may not fall below `MIN_ROOT_VERSION` and
`MIN_TARGETS_VERSION` (code), and no root version may be missing from the chain; a shipped root
whose files differ from `RELEASE_TRUST_FILES` is refused, saying what differs (issue 29; refused
rather than labelled since the adversarial round of 2026-12-05). Version 1 names exactly the pinned
keys, and every version needs `MIN_THRESHOLD` root keys for the root and targets roles.

Nothing is read from the current directory: a pull request that adds a key file, swaps a PEM or
edits a list changes nothing unless the change is signed by the offline root keys. Other sources
are explicit overrides (`--trust-root DIR`, `--trusted-keys FILE`) and are reported as such.
Snapshot and timestamp roles exist because TUF's Root requires them; with no repository to update
from they are not used (the package version is the snapshot). See docs/evidence.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Root, Targets

from grpo_conform.evidence.keys import TrustedKey, TrustedKeysError, keyid_of, parse_time

#: Key ids (sha256 of the DER SubjectPublicKeyInfo) of the two offline root keys. Changing these is
#: the only way to replace the trust root without the old root keys: a reviewed code change.
PINNED_ROOT_KEYIDS: frozenset[str] = frozenset({
    "cc905b892a7b821c69df5ac9c518386033d76c13ae44df370642d560fdaddd43",  # root-key-1
    "da98328cf3cf339dea4e1af14e4ffd06a3e8f1b323cef93f87834f90c9341767",  # root-key-2
})
#: The lowest root and targets versions this release accepts in its shipped trust root. A pull
#: request that restores an older signed targets.json (and deletes a newer N.root.json) would
#: otherwise make a key revoked since trusted again; with these in code a rollback must change
#: code (reviewed), not just files. Raise them with every release that ships newer metadata.
MIN_ROOT_VERSION = 1
MIN_TARGETS_VERSION = 1
#: The fewest root keys that must sign a change of the root or of the evidence keys, in every version
#: of a pinned root: with a threshold of 1, the holder of one root key could add an evidence key
#: alone (docs/evidence.md: "a single stolen or misused root key cannot add an evidence key").
MIN_THRESHOLD = 2
#: sha256 of each metadata file this release ships: a shipped trust root that differs (signed by
#: the root keys, but not what was released) is named as such, with what differs, in every report.
RELEASE_TRUST_FILES: dict[str, str] = {
    "1.root.json": "a3499755ac0b2a4abd5872b90e6cfdee22ab1ca127beb37d4e4e676db6f99e04",
    "targets.json": "af0f14357dfa84685f6b4e4c5ecb07f109999b2eee338f7526faa52d366221aa",
}
EVIDENCE_ROLE = "evidence"
FIELD = "x-grpo-conform-"  # prefix of our fields on a delegated key (TUF keeps unknown fields)
MAX_METADATA_BYTES = 1 << 20
MAX_ROOT_VERSIONS = 1000


@dataclass(frozen=True)
class TrustRoot:
    """The evidence keys a verified trust root names, and how that root was established."""

    keys: tuple[TrustedKey, ...]
    source: str  # one line for the report: where trust came from
    override: bool  # True when the user replaced the shipped root
    root_version: int | None = None
    expires: str | None = None


def shipped_trust_dir() -> Path:
    return Path(str(resources.files("grpo_conform.evidence").joinpath("trust")))


def _read(path: Path) -> Metadata:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrustedKeysError(path, f"cannot read trust metadata: {exc.strerror}") from None
    if len(data) > MAX_METADATA_BYTES:
        raise TrustedKeysError(path, f"trust metadata over {MAX_METADATA_BYTES} bytes; refusing to parse it")
    try:
        return Metadata.from_bytes(data)
    except Exception as exc:  # tuf raises several types for malformed metadata
        raise TrustedKeysError(path, f"not TUF metadata: {exc}") from None


def _verify(delegator: Metadata, role: str, delegate: Metadata, path: Path, what: str) -> None:
    try:
        delegator.verify_delegate(role, delegate)
    except UnsignedMetadataError as exc:
        raise TrustedKeysError(path, f"{what}: not signed by a threshold of the {role} keys ({exc})") from None


def _expired(signed: Root | Targets, now: datetime) -> bool:
    return signed.expires <= now


def _root_files(folder: Path) -> list[int]:
    """The versions of N.root.json present; a gap (2 missing beside 1 and 3) is an error, not the end."""
    versions = sorted(int(f.name.split(".")[0]) for f in folder.glob("*.root.json") if f.name.split(".")[0].isdigit())
    if versions and versions[-1] >= MAX_ROOT_VERSIONS:
        raise TrustedKeysError(folder, f"root version {versions[-1]}: over {MAX_ROOT_VERSIONS} versions; refusing it")
    missing = sorted(set(range(1, (versions[-1] if versions else 1) + 1)) - set(versions))
    if missing:
        raise TrustedKeysError(folder / f"{missing[0]}.root.json", f"root version {missing[0]} is missing but version "
                               f"{versions[-1]} is present: every version of the root chain must be kept")
    return versions


def release_differences(folder: Path) -> list[str]:
    """How the metadata files in `folder` differ from those this release ships (empty: identical)."""
    present = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.glob("*.json") if f.is_file()}
    out = []
    for name in sorted(set(present) | set(RELEASE_TRUST_FILES)):
        want, have = RELEASE_TRUST_FILES.get(name), present.get(name)
        if want is None:
            out.append(f"{name} added (sha256 {have[:12]})")  # type: ignore[index]
        elif have is None:
            out.append(f"{name} missing (release sha256 {want[:12]})")
        elif have != want:
            out.append(f"{name} sha256 {have[:12]}, release {want[:12]}")
    return out


def load_trust_root(folder: str | Path | None = None, *, pinned: frozenset[str] | None = PINNED_ROOT_KEYIDS,
                    now: datetime | None = None,
                    minimum: tuple[int, int] | None = (MIN_ROOT_VERSION, MIN_TARGETS_VERSION)) -> TrustRoot:
    """Verify the root chain and targets in `folder` (default: the shipped one) and return its evidence keys.

    `pinned=None` trusts whatever keys version 1 names (only for an explicit --trust-root override);
    `minimum` (root version, targets version) refuses a rolled-back root; it applies whenever the
    pinned keys do, since both guard the shipped root.
    """
    now = now or datetime.now(timezone.utc)
    override = folder is not None
    folder = Path(folder) if folder is not None else shipped_trust_dir()
    first = folder / "1.root.json"
    if not first.is_file():
        raise TrustedKeysError(first, "no trust root here: expected 1.root.json (and targets.json), as written by "
                               "tools/trust-root.py")
    root = _read(first)
    if not isinstance(root.signed, Root) or root.signed.version != 1:
        raise TrustedKeysError(first, "expected root metadata of version 1")
    if pinned is not None:
        named = frozenset(root.signed.roles[Root.type].keyids)
        if named != pinned:  # a subset would let one pinned key sign version 1 alone
            raise TrustedKeysError(first, f"its root keys {sorted(named)} are not the pinned root keys "
                                   f"{sorted(pinned)}; the trust root was replaced without the root keys")
        _thresholds(root.signed, first)
    _verify(root, Root.type, root, first, "root version 1")
    for version in _root_files(folder)[1:]:
        nxt = folder / f"{version}.root.json"
        new = _read(nxt)
        if not isinstance(new.signed, Root) or new.signed.version != version:
            raise TrustedKeysError(nxt, f"expected root metadata of version {version}")
        _verify(root, Root.type, new, nxt, f"root version {version} (by the keys of version {version - 1})")
        _verify(new, Root.type, new, nxt, f"root version {version} (by its own keys)")
        if pinned is not None:
            _thresholds(new.signed, nxt)
        root, first = new, nxt
    if _expired(root.signed, now):
        raise TrustedKeysError(first, f"the trust root expired at {root.signed.expires:%Y-%m-%dT%H:%M:%SZ}; "
                               "install a grpo-conform release with a renewed root")
    targets_file = folder / "targets.json"
    targets = _read(targets_file)
    if not isinstance(targets.signed, Targets):
        raise TrustedKeysError(targets_file, "expected targets metadata")
    _verify(root, Targets.type, targets, targets_file, "targets")
    if _expired(targets.signed, now):
        raise TrustedKeysError(targets_file, f"the evidence key list expired at "
                               f"{targets.signed.expires:%Y-%m-%dT%H:%M:%SZ}; install a release with renewed keys")
    if pinned is not None and minimum is not None:
        if root.signed.version < minimum[0]:
            raise TrustedKeysError(first, f"root version {root.signed.version} is older than version {minimum[0]}, "
                                   "the oldest this release accepts: a rolled-back trust root (a newer N.root.json "
                                   "was removed); reinstall the package")
        if targets.signed.version < minimum[1]:
            raise TrustedKeysError(targets_file, f"targets version {targets.signed.version} is older than version "
                                   f"{minimum[1]}, the oldest this release accepts: a rolled-back key list (it may "
                                   "trust a key revoked since); reinstall the package")
    keys = evidence_keys(targets.signed, targets_file)
    rk = root.signed.roles[Root.type]
    tk = root.signed.roles[Targets.type]
    if override:
        where = "override --trust-root " + str(folder)
    else:
        differs = release_differences(folder)
        if differs and pinned is not None:
            # signed by the root keys yet not what this release ships: package data changed in a checkout or
            # an install; a deliberate new root is named with --trust-root, a release updates the code's list
            raise TrustedKeysError(folder, "the shipped trust root differs from the one this release ships ("
                                   + "; ".join(differs) + "): reinstall grpo-conform, or pass --trust-root "
                                   f"{folder} to use it deliberately")
        where = ("shipped trust root" if not differs else
                 "trust root DIFFERING FROM THIS RELEASE (" + "; ".join(differs) + ")")
    source = (f"{where}: root v{root.signed.version} ({rk.threshold} of {len(rk.keyids)} root keys, expires "
              f"{root.signed.expires:%Y-%m-%d}), targets v{targets.signed.version} ({tk.threshold} of "
              f"{len(tk.keyids)} keys, expires {targets.signed.expires:%Y-%m-%d})")
    return TrustRoot(keys, source, override, root.signed.version, f"{root.signed.expires:%Y-%m-%dT%H:%M:%SZ}")


def _thresholds(signed: Root, where: Path) -> None:
    """Refuse a pinned root whose root or targets role needs fewer than MIN_THRESHOLD keys."""
    for role in (Root.type, Targets.type):
        threshold = signed.roles[role].threshold
        if threshold < MIN_THRESHOLD:
            raise TrustedKeysError(where, f"root version {signed.version}: the {role} role's threshold is "
                                   f"{threshold}; this release requires at least {MIN_THRESHOLD} root keys for "
                                   "every change of trust")


def _public_key(key: Any, where: Path, keyid: str) -> Ed25519PublicKey:
    if key.keytype != "ed25519" or key.scheme != "ed25519":
        raise TrustedKeysError(where, f"delegated key {keyid}: {key.keytype}/{key.scheme}; expected ed25519")
    try:
        raw = bytes.fromhex(key.keyval["public"])
        public = Ed25519PublicKey.from_public_bytes(raw)
    except (KeyError, ValueError) as exc:
        raise TrustedKeysError(where, f"delegated key {keyid}: unreadable public key ({exc})") from None
    if keyid_of(public) != keyid:  # our key ids are the DER hash, checked here, not taken on trust
        raise TrustedKeysError(where, f"delegated key {keyid}: its public key has key id {keyid_of(public)}")
    return public


def evidence_keys(targets: Targets, where: Path) -> tuple[TrustedKey, ...]:
    delegations = targets.delegations
    if delegations is None or delegations.roles is None or EVIDENCE_ROLE not in delegations.roles:
        raise TrustedKeysError(where, f"targets delegates no '{EVIDENCE_ROLE}' role: no key may sign evidence")
    active = set(delegations.roles[EVIDENCE_ROLE].keyids)
    out = []
    for keyid, key in sorted(delegations.keys.items()):
        extra = key.unrecognized_fields
        try:
            valid_from = parse_time(extra.get(FIELD + "valid-from", "1970-01-01T00:00:00Z"))
            until = extra.get(FIELD + "valid-until")
            valid_until = parse_time(until) if until else None
        except ValueError as exc:
            raise TrustedKeysError(where, f"delegated key {keyid}: {exc}") from None
        revoked = keyid not in active or bool(extra.get(FIELD + "revoked", False))
        reason = extra.get(FIELD + "revoked-reason") or ("not in the evidence role" if keyid not in active else None)
        out.append(TrustedKey(keyid, _public_key(key, where, keyid), f"{where}#{keyid[:12]}",
                              str(extra.get(FIELD + "owner", "unnamed")), valid_from, valid_until, revoked, reason))
    return tuple(out)


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
