"""Signed evidence records: an in-toto Statement v1 per implementation, in a DSSE envelope, Ed25519.

The CLI parses options into the requests below and prints the reports; nothing here prints.

- `build_statement(report, impl, member)` -> dict (predicate v2); `write_record(statement, path, key)`;
  `write_evidence(report, dir, key)`: one record per implementation x member, self-contradictions refused
- `run_keygen(KeygenRequest)` -> KeygenReport
- `run_sign(SignRequest)` -> SignReport
- `run_verify(VerifyRequest)` -> VerifyReport (trust: the root shipped in evidence/trust/, `trust.py`)
- `load_signing_key(path)`: explicit path, else $GRPO_CONFORM_SIGNING_KEY, else $GRPO_CONFORM_SIGNING_KEY_FILE

Trust: TUF metadata shipped in evidence/trust/ (trust.py), pinned root keys, never the current
directory. Semantics shared by sign and verify: semantics.py. Policy: policy.py. RFC 3161: timestamps.py.
Formats and rules: docs/evidence.md.
"""

from grpo_conform.evidence.dsse import PAYLOAD_TYPE, Envelope, EnvelopeError, loads_strict, pae, parse_envelope
from grpo_conform.evidence.keys import (
    DEFAULT_TRUSTED_KEYS,
    ENV_SIGNING_KEY,
    ENV_SIGNING_KEY_FILE,
    KeygenReport,
    KeygenRequest,
    SigningKey,
    SigningKeyError,
    TrustedKey,
    TrustedKeysError,
    keygen,
    keyid_of,
    load_signing_key,
    load_trusted_keys,
    run_keygen,
)
from grpo_conform.evidence.records import (
    RecordError,
    SignReport,
    ToSign,
    check_publishable,
    preflight,
    SignRequest,
    WrittenRecord,
    record_filename,
    run_sign,
    sign_record,
    write_evidence,
    write_record,
)
from grpo_conform.evidence.statement import (
    PREDICATE_TYPE,
    PREDICATE_V1,
    STATEMENT_TYPE,
    builder_identity,
    StatementError,
    build_statement,
    schema_problems,
    statement_bytes,
)
from grpo_conform.evidence.verify import (
    FileVerification,
    IdentityCheck,
    StepResult,
    VerifyReport,
    VerifyRequest,
    run_verify,
    verify_file,
)
from grpo_conform.evidence.partial import partial_reason
from grpo_conform.evidence.policy import Policy, PolicyError, load_policy, policy_problems
from grpo_conform.evidence.semantics import semantic_problems
from grpo_conform.evidence.terminal import safe
from grpo_conform.evidence.trust import PINNED_ROOT_KEYIDS, TrustRoot, load_trust_root

__all__ = [
    "DEFAULT_TRUSTED_KEYS", "ENV_SIGNING_KEY", "ENV_SIGNING_KEY_FILE", "PAYLOAD_TYPE", "PREDICATE_TYPE",
    "STATEMENT_TYPE", "Envelope", "EnvelopeError", "FileVerification", "IdentityCheck", "KeygenReport",
    "KeygenRequest", "RecordError", "SignReport", "SignRequest", "SigningKey", "SigningKeyError", "StatementError",
    "StepResult", "TrustedKey", "TrustedKeysError", "VerifyReport", "VerifyRequest", "WrittenRecord",
    "build_statement", "keygen", "keyid_of", "load_signing_key", "load_trusted_keys", "pae", "parse_envelope",
    "record_filename", "run_keygen", "run_sign", "run_verify", "schema_problems", "sign_record",
    "statement_bytes", "verify_file", "write_evidence", "write_record",
    "PINNED_ROOT_KEYIDS", "PREDICATE_V1", "Policy", "PolicyError", "ToSign", "TrustRoot", "builder_identity",
    "check_publishable", "load_policy", "load_trust_root", "loads_strict", "policy_problems", "preflight", "safe",
    "semantic_problems", "partial_reason",
]
