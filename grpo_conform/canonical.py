"""One way to serialize: RFC 8785 (JCS) canonical JSON, and SHA-256 identities over it."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of a JSON value; refuses NaN, Inf and integers beyond 2^53-1."""
    return rfc8785.dumps(value)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def identity(value: Any) -> str:
    """sha256 of the canonical JSON of `value` (lowercase hex)."""
    return sha256_hex(canonical_bytes(value))
