"""Signed evidence records: an in-toto Statement v1 per implementation, in a DSSE envelope, Ed25519.

The CLI parses options into the requests below and prints the reports; nothing here prints.

- `build_statement(report, impl)` -> dict; `write_record(statement, path, key)`; `write_evidence`
- `run_keygen(KeygenRequest)` -> KeygenReport
- `run_sign(SignRequest)` -> SignReport
- `run_verify(VerifyRequest)` -> VerifyReport
- `load_signing_key(path)`: explicit path, else $GRPO_CONFORM_SIGNING_KEY, else $GRPO_CONFORM_SIGNING_KEY_FILE

Formats and rules: docs/evidence.md.
"""

from grpo_conform.evidence.dsse import PAYLOAD_TYPE, Envelope, EnvelopeError, pae, parse_envelope
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
    STATEMENT_TYPE,
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

__all__ = [
    "DEFAULT_TRUSTED_KEYS", "ENV_SIGNING_KEY", "ENV_SIGNING_KEY_FILE", "PAYLOAD_TYPE", "PREDICATE_TYPE",
    "STATEMENT_TYPE", "Envelope", "EnvelopeError", "FileVerification", "IdentityCheck", "KeygenReport",
    "KeygenRequest", "RecordError", "SignReport", "SignRequest", "SigningKey", "SigningKeyError", "StatementError",
    "StepResult", "TrustedKey", "TrustedKeysError", "VerifyReport", "VerifyRequest", "WrittenRecord",
    "build_statement", "keygen", "keyid_of", "load_signing_key", "load_trusted_keys", "pae", "parse_envelope",
    "record_filename", "run_keygen", "run_sign", "run_verify", "schema_problems", "sign_record",
    "statement_bytes", "verify_file", "write_evidence", "write_record",
]
