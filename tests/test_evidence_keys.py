"""Keys: keygen, where the signing key comes from, and the trusted-keys list."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from grpo_conform.errors import EXIT_USAGE
from grpo_conform.evidence import (
    ENV_SIGNING_KEY,
    ENV_SIGNING_KEY_FILE,
    KeygenRequest,
    SigningKeyError,
    TrustedKeysError,
    keygen,
    load_signing_key,
    load_trusted_keys,
    run_keygen,
)
from grpo_conform.evidence.keys import TRUSTED_KEYS_FORMAT, load_public_key_file, parse_time
from grpo_conform.evidence.statement import PROJECT_ROOT
from test_evidence_support import new_key
from test_evidence_support import trust_list as trust


def test_keygen_writes_a_pair(tmp_path) -> None:
    report = run_keygen(KeygenRequest(str(tmp_path / "k" / "sign.pem"), str(tmp_path / "k" / "sign.pub.pem")))
    private, public = tmp_path / "k" / "sign.pem", tmp_path / "k" / "sign.pub.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    der = serialization.load_pem_public_key(public.read_bytes()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert report.keyid == hashlib.sha256(der).hexdigest() == load_signing_key(private).keyid
    assert report.exit_code == 0 and report.to_json()["keyid"] == report.keyid


def test_keygen_refuses_to_overwrite(tmp_path) -> None:
    (tmp_path / "pub.pem").write_text("keep me")
    with pytest.raises(SigningKeyError, match="already exists") as err:
        keygen(tmp_path / "priv.pem", tmp_path / "pub.pem")
    assert err.value.exit_code == EXIT_USAGE
    assert not (tmp_path / "priv.pem").exists() and (tmp_path / "pub.pem").read_text() == "keep me"
    keygen(tmp_path / "a.pem", tmp_path / "a.pub.pem")
    with pytest.raises(SigningKeyError, match="a.pem: already exists"):
        keygen(tmp_path / "a.pem", tmp_path / "b.pub.pem")


def test_signing_key_sources_in_order(tmp_path) -> None:
    a = keygen(tmp_path / "a.pem", tmp_path / "a.pub")
    b = keygen(tmp_path / "b.pem", tmp_path / "b.pub")
    c = keygen(tmp_path / "c.pem", tmp_path / "c.pub")
    env = {ENV_SIGNING_KEY: (tmp_path / "b.pem").read_text(), ENV_SIGNING_KEY_FILE: str(tmp_path / "c.pem")}
    assert load_signing_key(tmp_path / "a.pem", env).keyid == a
    got = load_signing_key(None, env)
    assert got.keyid == b and got.source == f"environment variable {ENV_SIGNING_KEY}"
    got = load_signing_key(None, {ENV_SIGNING_KEY_FILE: str(tmp_path / "c.pem")})
    assert got.keyid == c and ENV_SIGNING_KEY_FILE in got.source
    assert load_signing_key(None, {}) is None
    assert load_signing_key(None, {ENV_SIGNING_KEY: "  ", ENV_SIGNING_KEY_FILE: ""}) is None
    flattened = (tmp_path / "b.pem").read_text().strip().replace("\n", "\\n")  # as some CI stores keep it
    assert load_signing_key(None, {ENV_SIGNING_KEY: flattened}).keyid == b


def test_signing_key_errors_name_the_source(tmp_path) -> None:
    with pytest.raises(SigningKeyError, match="missing.pem: signing key file not found"):
        load_signing_key(tmp_path / "missing.pem")
    with pytest.raises(SigningKeyError, match=f"environment variable {ENV_SIGNING_KEY}: not a PEM private key"):
        load_signing_key(None, {ENV_SIGNING_KEY: "hello"})
    with pytest.raises(SigningKeyError, match=f"{ENV_SIGNING_KEY_FILE} names .*not a file"):
        load_signing_key(None, {ENV_SIGNING_KEY_FILE: str(tmp_path / "nope.pem")})
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "rsa.pem").write_bytes(rsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(SigningKeyError, match="rsa.pem: a .*RSAPrivateKey; expected an Ed25519 key"):
        load_signing_key(tmp_path / "rsa.pem")
    encrypted = new_key().private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.BestAvailableEncryption(b"pw"))
    (tmp_path / "enc.pem").write_bytes(encrypted)
    with pytest.raises(SigningKeyError, match="enc.pem: the key is encrypted"):
        load_signing_key(tmp_path / "enc.pem")
    (tmp_path / "pub-as-priv.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\nAA==\n-----END PUBLIC KEY-----\n")
    with pytest.raises(SigningKeyError, match="not a PEM private key"):
        load_signing_key(tmp_path / "pub-as-priv.pem")


def test_trusted_keys_load(tmp_path) -> None:
    key = new_key()
    path = trust(tmp_path, (key, {"valid_until": "2027-01-01T00:00:00Z", "revoked": True, "revoked_reason": "lost"}))
    (entry,) = load_trusted_keys(path)
    assert entry.keyid == key.keyid and entry.revoked and entry.revoked_reason == "lost"
    assert entry.valid_at(parse_time("2026-06-01T00:00:00Z")) and not entry.valid_at(parse_time("2027-01-01T00:00:00Z"))
    assert not entry.valid_at(parse_time("2025-12-31T23:59:59Z"))


@pytest.mark.parametrize("overrides, message", [
    ({"keyid": "0" * 64}, r"keys\[0\].keyid: listed 0+, but .* has key id"),
    ({"revokd": True}, r"unknown field\(s\) \['revokd'\]"),
    ({"valid_from": "2026-01-01"}, "expected an RFC 3339 UTC time ending in Z"),
    ({"valid_until": 5}, "valid_until: expected an RFC 3339 time or null"),
    ({"revoked": "no"}, "revoked: missing or not a bool"),
    ({"public_key": "absent.pem"}, r"keys\[0\].public_key: .*absent.pem: cannot read the public key"),
])
def test_trusted_keys_errors(tmp_path, overrides, message) -> None:
    path = trust(tmp_path, (new_key(), overrides))
    with pytest.raises(TrustedKeysError, match=message) as err:
        load_trusted_keys(path)
    assert err.value.exit_code == EXIT_USAGE


def test_trusted_keys_refuses_a_key_listed_twice(tmp_path) -> None:
    key = new_key()
    path = trust(tmp_path, (key, {}), (key, {"revoked": True}))
    with pytest.raises(TrustedKeysError, match=r"keys\[1\]: key .* is listed twice"):
        load_trusted_keys(path)


def test_trusted_keys_file_errors(tmp_path) -> None:
    with pytest.raises(TrustedKeysError, match="trusted-keys list not found; pass --trusted-keys FILE"):
        load_trusted_keys(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TrustedKeysError, match="not valid JSON"):
        load_trusted_keys(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text(json.dumps([{"keyid": "x"}]))
    with pytest.raises(TrustedKeysError, match=TRUSTED_KEYS_FORMAT):
        load_trusted_keys(tmp_path / "list.json")


def test_committed_key_list_is_what_the_shipped_trust_root_signed() -> None:
    """The committed list is only the input of tools/trust-root.py; what verify trusts is the signed
    targets.json. The two must agree (else a maintainer forgot to re-sign), and the published key id is
    a literal here, not recomputed from a PEM a pull request could swap."""
    from grpo_conform.evidence import load_trust_root

    published = "cc3e6bd1b854b6659c46050de1478a6a8acd761d05077e126fc8ea099a752d9c"
    listed = load_trusted_keys(PROJECT_ROOT / "evidence" / "keys" / "trusted-keys.json")
    shipped = load_trust_root().keys
    assert [(k.keyid, k.owner, k.valid_from, k.valid_until, k.revoked) for k in listed] == \
        [(k.keyid, k.owner, k.valid_from, k.valid_until, k.revoked) for k in shipped]
    assert [k.keyid for k in shipped] == [published]
    public = load_public_key_file(PROJECT_ROOT / "evidence" / "keys" / "maintainers-2026.pub.pem")
    assert hashlib.sha256(public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest() == published
    # Only public material is committed.
    for root in (PROJECT_ROOT / "evidence", PROJECT_ROOT / "grpo_conform" / "evidence" / "trust"):
        for f in root.rglob("*"):
            if f.is_file():
                assert b"PRIVATE KEY" not in f.read_bytes(), f
