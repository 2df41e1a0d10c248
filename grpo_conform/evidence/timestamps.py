"""RFC 3161 timestamps: a time for a signature that the signer does not choose alone.

Without one, key validity is judged at the verification time: a record's own times are written by
the signer, so `valid_until` cannot stop a key holder from back-dating (and an expired key's
records must be re-signed with a current key). With a token from a time-stamping authority over
the signature bytes, saved beside the record as `<record>.tsr`, and that authority's root
certificate trusted (`verify --tsa-cert PEM`), the key's window is judged at the token's genTime:
records signed while the key was valid stay valid after it expires. Revocation still wins.

`sign --timestamp-query FILE` writes the query for the new signature; send it to a TSA
(`curl -H 'Content-Type: application/timestamp-query' --data-binary @FILE URL > RECORD.tsr`).
Parsing and verification (CMS signature, certificate chain, message imprint) are rfc3161-client's.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509

from grpo_conform.errors import GrpoConformError

MAX_TOKEN_BYTES = 64 << 10
SUFFIX = ".tsr"


class TimestampError(GrpoConformError):
    """A timestamp token or TSA certificate that cannot be used; says which and why."""


def token_path(record: str | Path) -> Path:
    return Path(str(record) + SUFFIX)


def timestamp_query(signature: bytes) -> bytes:
    """The DER TimeStampReq (sha256 imprint of the signature bytes, nonce, certificate requested)."""
    from rfc3161_client import HashAlgorithm, TimestampRequestBuilder  # only when a timestamp is asked for

    builder = TimestampRequestBuilder().data(signature).hash_algorithm(HashAlgorithm.SHA256)
    return builder.nonce(nonce=True).cert_request(cert_request=True).build().as_bytes()


def load_tsa_roots(paths: tuple[str, ...]) -> tuple[x509.Certificate, ...]:
    roots = []
    for p in paths:
        try:
            roots.extend(x509.load_pem_x509_certificates(Path(p).read_bytes()))
        except (OSError, ValueError) as exc:
            raise TimestampError(f"{p}: not a PEM certificate of a time-stamping authority ({exc})") from None
    return tuple(roots)


def token_time(token: bytes, signature: bytes, roots: tuple[x509.Certificate, ...]) -> datetime:
    """genTime of a token that verifies over `signature` under one of `roots`, else TimestampError."""
    from rfc3161_client import VerificationError, VerifierBuilder, decode_timestamp_response  # only for a token

    if len(token) > MAX_TOKEN_BYTES:
        raise TimestampError(f"timestamp token of {len(token)} bytes; over {MAX_TOKEN_BYTES} is refused")
    try:
        response = decode_timestamp_response(token)
    except ValueError as exc:
        raise TimestampError(f"not an RFC 3161 TimeStampResp: {exc}") from None
    builder = VerifierBuilder()
    for root in roots:
        builder = builder.add_root_certificate(root)
    try:
        builder.build().verify_message(response, signature)
    except (VerificationError, ValueError) as exc:
        raise TimestampError(f"the timestamp token does not verify over this signature: {exc}") from None
    when = response.tst_info.gen_time
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
