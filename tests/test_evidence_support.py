"""Helpers shared by the evidence tests: a throw-away project, synthetic reports, keys and trust roots.

Every key here is generated in a temporary folder; no test reads the maintainers' private keys.
The project is built in tmp_path (an implementation folder, the frozen seed spec, a pyproject.toml
marker), so identities are recomputable whatever other engineers do to implementations/.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from grpo_conform.evidence import SigningKey, VerifyRequest, build_statement, run_verify
from grpo_conform.evidence.dsse import Envelope, make_envelope
from grpo_conform.evidence.keys import TRUSTED_KEYS_FORMAT, public_pem
from grpo_conform.evidence.records import atomic_write, envelope_text
from grpo_conform.evidence.statement import PROJECT_ROOT, schema_problems, statement_bytes
from grpo_conform.evidence.trust_build import EvidenceKey, build_root, build_targets, sign_metadata, write_metadata
from grpo_conform.implementations import folder_listing
from grpo_conform.results import CheckOutcome, ImplementationResult, WorkloadResult
from grpo_conform.spec import load_spec

SEED_SPEC = PROJECT_ROOT / "specs" / "grpo-token-is.v1.json"  # frozen: its identity never changes
FINISHED = "2026-12-01T10:00:05Z"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Report:
    """The fields of a CheckReport that build_statement reads (kept here so these tests do not depend
    on the orchestration module other engineers are changing)."""

    device: dict[str, Any]
    interpreter: bool
    implementations: tuple[Any, ...]
    specs: dict[str, Any]
    started: str
    finished: str
    software: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)


def make_project(root: Path, impls: tuple[str, ...] = ("pytorch",)) -> Path:
    """A minimal checkout: pyproject.toml, specs/ with the seed spec, implementations/<name>/."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[project]\nname = "scratch"\n')
    (root / "specs").mkdir(exist_ok=True)
    shutil.copy(SEED_SPEC, root / "specs" / SEED_SPEC.name)
    for name in impls:
        folder = root / "implementations" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "implementation.toml").write_text(f'name = "{name}"\nspec = "grpo-token-is@1.0.0"\n'
                                                    'entry = "impl:grpo_loss"\nlanguage = "python"\n')
        (folder / "impl.py").write_text(f"# {name}\ndef grpo_loss(**kw):\n    raise NotImplementedError\n")
    return root


def identity_of(folder: Path) -> str:
    return hashlib.sha256(folder_listing(folder).encode()).hexdigest()


def outcome(check: str, status: str, informational: bool = False, **evidence: Any) -> CheckOutcome:
    return CheckOutcome(check, status, f"{check}: {status}", dict(evidence), informational)  # type: ignore[arg-type]


def synthetic_impl(folder: Path, status: str = "conformant",
                   outcomes: tuple[CheckOutcome, ...] | None = None, workload: str = "seed-b2") -> ImplementationResult:
    outcomes = outcomes if outcomes is not None else (
        outcome("loss", "pass", actual=0.5, expected=0.5000001, abs_error=1e-7),
        outcome("no-aliasing", "pass", overlaps=[]),
        outcome("determinism", "pass", informational=True, bitwise_equal=True),
    )
    timings = ({"protocol": "full", "median_ns": 1_234_567, "reps": 50, "achieved_fraction": 0.71},)
    w = WorkloadResult(workload, {"batch": 2, "seq": 3, "vocab": 11, "seq_next": 4},
                       {"logits": "bfloat16", "advantages": "float32"}, "cpu", (2464000050388509931, 7), outcomes,
                       timings)
    manifest = {"name": folder.name, "language": "python", "license": "MIT", "source": None,
                "description": f"test implementation {folder.name}"}
    return ImplementationResult(folder.name, str(folder), identity_of(folder), manifest, status,  # type: ignore
                                "synthetic", (w,), {"pid": 1})


def synthetic_report(project: Path, impl: ImplementationResult, device: dict[str, Any] | None = None) -> Report:
    spec = load_spec(project / "specs" / SEED_SPEC.name)
    software = {"python": "3.11.7", "torch": "2.13.0", "triton": None, "grpo_conform": "0.1.0",
                "cuda_runtime": None, "git_commit": None, "git_dirty": None}
    return Report(device or {"kind": "cpu", "name": "x86_64"}, True, (impl,), {spec.identity: spec},
                  "2026-12-01T10:00:00Z", FINISHED, software, {})


def statement_for(project: Path, name: str = "pytorch", monkeypatch: Any = None, **impl_changes: Any) -> dict:
    """A v2 statement for implementations/<name> of `project` (paths relative to the project: cwd is set there)."""
    import os

    old = os.getcwd()
    os.chdir(project)
    try:
        impl = synthetic_impl(project / "implementations" / name, **impl_changes)
        return build_statement(synthetic_report(project, impl), impl)
    finally:
        os.chdir(old)


def new_key() -> SigningKey:
    return SigningKey.of(Ed25519PrivateKey.generate(), "test")


def trust_list(folder: Path, *entries: tuple[SigningKey, dict[str, Any]], name: str = "trusted.json") -> str:
    """A trusted-keys list (the --trusted-keys override format) in `folder` for the given keys."""
    keys = []
    for key, overrides in entries:
        pub = folder / f"{key.keyid[:12]}.pub.pem"
        pub.write_bytes(public_pem(key.public_key))
        entry = {"keyid": key.keyid, "public_key": pub.name, "owner": f"owner-{key.keyid[:6]}",
                 "valid_from": "2026-01-01T00:00:00Z", "valid_until": None, "revoked": False}
        entry.update(overrides)
        keys.append(entry)
    path = folder / name
    path.write_text(json.dumps({"format": TRUSTED_KEYS_FORMAT, "keys": keys}, indent=2))
    return str(path)


@dataclass
class TrustFixture:
    """A throw-away trust root: two root keys (threshold 2) delegating evidence to `evidence` keys."""

    folder: Path
    roots: list[Ed25519PrivateKey]
    pinned: frozenset[str]


def make_trust_root(folder: Path, *evidence: tuple[SigningKey, dict[str, Any]], threshold: int = 2,
                    expires: datetime | None = None) -> TrustFixture:
    roots = [Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()]
    expires = expires or NOW + timedelta(days=365)
    root = build_root(1, [k.public_key() for k in roots], threshold, expires)
    write_metadata(sign_metadata(root, roots), folder / "1.root.json")
    write_targets(folder, roots, *evidence, expires=expires)
    from grpo_conform.evidence.keys import keyid_of

    return TrustFixture(folder, roots, frozenset(keyid_of(k.public_key()) for k in roots))


def write_targets(folder: Path, signers: list[Ed25519PrivateKey], *evidence: tuple[SigningKey, dict[str, Any]],
                  version: int = 1, expires: datetime | None = None) -> None:
    keys = [EvidenceKey(k.public_key, f"owner-{k.keyid[:6]}", "2026-01-01T00:00:00Z", **o) for k, o in evidence]
    md = build_targets(version, keys, expires or NOW + timedelta(days=365))
    write_metadata(sign_metadata(md, signers), folder / "targets.json")


def write_envelope(path: Path, envelope: Envelope | dict[str, Any]) -> str:
    text = envelope_text(envelope) if isinstance(envelope, Envelope) else json.dumps(envelope)
    atomic_write(path, text)
    return str(path)


def signed_record(path: Path, statement: dict[str, Any] | bytes, key: SigningKey | None) -> str:
    """A record written without write_record's checks, so tests can sign broken statements."""
    payload = statement if isinstance(statement, bytes) else statement_bytes(statement)
    return write_envelope(path, make_envelope(payload, key))


def verify(paths: str | list[str], trust_root: TrustFixture | str, **kw: Any):
    """run_verify on `paths` under a throw-away trust root (or a --trusted-keys list path)."""
    paths = [paths] if isinstance(paths, str) else paths
    if isinstance(trust_root, TrustFixture):
        kw["trust_root"] = str(trust_root.folder)
    else:
        kw["trusted_keys"] = trust_root
    kw.setdefault("now", NOW)
    kw.setdefault("project", next((p for p in map(record_project, paths) if p), None))
    return run_verify(VerifyRequest(tuple(paths), **kw))


def record_project(path: str) -> str | None:
    """The scratch project a test record sits in, passed as --project as a user would: verify itself
    never looks next to a record for the project (issue 29)."""
    for d in Path(path).resolve().parents:
        if (d / "pyproject.toml").is_file():
            return str(d)
    return None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def payload_of(path: str | Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(json.loads(Path(path).read_text())["payload"]))


def test_synthetic_statement_is_valid(tmp_path) -> None:
    project = make_project(tmp_path / "p")
    st = statement_for(project)
    assert schema_problems(st) == []
    assert st["subject"] == [{"name": "implementations/pytorch",
                              "digest": {"dirHash": identity_of(project / "implementations" / "pytorch")}}]
