"""Helpers shared by the evidence tests: a synthetic CheckReport, throw-away keys, trust lists.

Every key here is generated in a temporary folder; no test reads the maintainers' private key.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from grpo_conform.check import CheckReport
from grpo_conform.evidence import SigningKey, VerifyRequest, build_statement, run_verify
from grpo_conform.evidence.dsse import Envelope, make_envelope
from grpo_conform.evidence.keys import TRUSTED_KEYS_FORMAT, public_pem
from grpo_conform.evidence.records import atomic_write, envelope_text
from grpo_conform.evidence.statement import PROJECT_ROOT, schema_problems, statement_bytes
from grpo_conform.implementations import load_implementation
from grpo_conform.results import CheckOutcome, ImplementationResult, WorkloadResult
from grpo_conform.spec import load_spec

SPEC_FILE = PROJECT_ROOT / "specs" / "grpo-token-is.v1.json"
PYTORCH = PROJECT_ROOT / "implementations" / "pytorch"
FINISHED = "2026-12-01T10:00:05Z"


def outcome(check: str, status: str, informational: bool = False, **evidence: Any) -> CheckOutcome:
    return CheckOutcome(check, status, f"{check}: {status}", dict(evidence), informational)  # type: ignore[arg-type]


def synthetic_impl(folder: Path = PYTORCH, status: str = "conformant",
                   outcomes: tuple[CheckOutcome, ...] | None = None) -> ImplementationResult:
    impl = load_implementation(folder)
    outcomes = outcomes if outcomes is not None else (
        outcome("loss", "pass", actual=0.5, expected=0.5000001, abs_error=1e-7),
        outcome("no-aliasing", "pass", overlaps=[]),
        outcome("determinism", "pass", informational=True, bitwise_equal=True),
    )
    timings = ({"protocol": "full", "median_ns": 1_234_567, "p10_ns": 1_200_000, "reps": 50,
                "bytes_moved": 3 * 2**30, "achieved_fraction": 0.71},)
    workload = WorkloadResult("small", {"batch": 2, "seq": 3, "vocab": 11, "seq_next": 4},
                              {"logits": "bfloat16", "advantages": "float32"}, "cpu",
                              (2464000050388509931, 7), outcomes, timings)
    return ImplementationResult(impl.name, str(impl.path), impl.identity, impl.manifest.model_dump(mode="json"),
                                status, "synthetic", (workload,), {"pid": 1})  # type: ignore[arg-type]


def synthetic_report(impl: ImplementationResult | None = None, hardware: dict[str, Any] | None = None) -> CheckReport:
    spec = load_spec(SPEC_FILE)
    impl = impl or synthetic_impl()
    software = {"python": "3.11.7", "torch": "2.13.0", "triton": None, "grpo_conform": "0.1.0",
                "cuda_runtime": None, "git_commit": "b" * 40, "git_dirty": False}
    return CheckReport({"kind": "cpu", "name": "x86_64"}, True, (impl,), {spec.identity: spec},
                       "2026-12-01T10:00:00Z", FINISHED, software, hardware or {})


def synthetic_statement(**changes: Any) -> dict[str, Any]:
    return build_statement(synthetic_report(), synthetic_impl(**changes))


def new_key() -> SigningKey:
    return SigningKey.of(Ed25519PrivateKey.generate(), "test")


def trust(folder: Path, *entries: tuple[SigningKey, dict[str, Any]], name: str = "trusted.json") -> str:
    """A trusted-keys list in `folder` for the given keys (each with field overrides)."""
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


def write_envelope(path: Path, envelope: Envelope | dict[str, Any]) -> str:
    text = envelope_text(envelope) if isinstance(envelope, Envelope) else json.dumps(envelope)
    atomic_write(path, text)
    return str(path)


def signed_record(path: Path, statement: dict[str, Any] | bytes, key: SigningKey | None) -> str:
    """A record written without write_record's schema check, so tests can sign broken statements."""
    payload = statement if isinstance(statement, bytes) else statement_bytes(statement)
    return write_envelope(path, make_envelope(payload, key))


def verify_one(path: str, trusted: str, allow_unsigned: bool = False):
    return run_verify(VerifyRequest((path,), trusted, allow_unsigned)).files[0]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_synthetic_statement_is_valid() -> None:
    assert schema_problems(synthetic_statement()) == []

