"""RFC 3161 timestamps: a key's window judged at a time-stamping authority's time, not the signer's.

The TSA here is openssl's `ts -reply` with a throw-away CA, run in tmp_path.
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from grpo_conform.evidence import SignRequest, run_sign, write_record
from grpo_conform.evidence.timestamps import TimestampError, load_tsa_roots, token_path
from test_evidence_support import NOW, make_project, make_trust_root, new_key, statement_for, verify, write_targets

CONFIG = """[req]
distinguished_name=dn
prompt=no
[dn]
CN=Test TSA Root
[v3_ca]
basicConstraints=critical,CA:true
keyUsage=critical,keyCertSign,cRLSign
[v3_tsa]
basicConstraints=critical,CA:false
extendedKeyUsage=critical,timeStamping
keyUsage=critical,digitalSignature
[tsa_config]
serial=./serial
signer_digest=sha256
default_policy=1.2.3.4.1
other_policies=1.2.3.4.2
digests=sha256
accuracy=secs:1
ordering=no
tsa_name=no
ess_cert_id_chain=no
ess_cert_id_alg=sha256
crypto_device=builtin
signer_cert=./tsa.crt
signer_key=./tsa.key
"""

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def _run(args: list[str], cwd: Path) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture()
def tsa(tmp_path) -> Path:
    d = tmp_path / "tsa"
    d.mkdir()
    (d / "ca.cnf").write_text(CONFIG)
    (d / "serial").write_text("01\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _run(["openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30", "-config", "ca.cnf",
          "-extensions", "v3_ca"], d)
    _run(["openssl", "req", *ec, "-keyout", "tsa.key", "-out", "tsa.csr", "-subj", "/CN=Test TSA"], d)
    _run(["openssl", "x509", "-req", "-in", "tsa.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
          "-out", "tsa.crt", "-days", "30", "-extfile", "ca.cnf", "-extensions", "v3_tsa"], d)
    return d


def _reply(tsa: Path, query: Path, out: Path) -> None:
    _run(["openssl", "ts", "-reply", "-queryfile", str(query), "-config", "ca.cnf", "-section", "tsa_config",
          "-out", str(out)], tsa)


@pytest.fixture()
def stamped(tmp_path, tsa):
    """A record signed through `sign --timestamp-query`, answered by the TSA and saved as RECORD.tsr."""
    project = make_project(tmp_path / "proj")
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    record = project / "evidence" / "r.intoto.json"
    write_record(statement_for(project), record, None)
    pem = tmp_path / "k.pem"
    pem.write_bytes(key.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    run_sign(SignRequest((str(record),), str(pem), timestamp_query=True, project=str(project)))
    _reply(tsa, Path(str(record) + ".tsq"), token_path(record))
    return project, key, trust, str(record), str(tsa / "ca.crt")


def test_a_timestamp_keeps_a_record_valid_after_its_key_expired(stamped) -> None:
    """The key ended after the TSA's time (the real clock, when the test signed) but before the verify time."""
    _, key, trust, record, ca = stamped
    later = NOW + timedelta(days=300)  # the key ends before "now" of this verification
    write_targets(trust.folder, trust.roots, (key, {"valid_until": _fmt(later - timedelta(days=1))}), version=2,
                  expires=later + timedelta(days=30))
    without = verify(record, trust, now=later).files[0]
    assert without.step("signature").status == "fail"
    assert any("no TSA certificate is trusted" in n for n in without.step("signature").notes)
    f = verify(record, trust, now=later, tsa_certs=(ca,)).files[0]
    assert f.ok, f.steps
    assert any("the time of its RFC 3161 timestamp" in n for n in f.step("signature").notes)


def test_a_token_from_another_signature_is_refused(stamped, tsa, tmp_path) -> None:
    project, key, trust, record, ca = stamped
    other = project / "evidence" / "o.intoto.json"
    st = statement_for(project)
    st["predicate"]["message"] = "another record, signed by the same key"
    write_record(st, other, key)
    shutil.copy(token_path(record), token_path(other))
    later = NOW + timedelta(days=300)
    write_targets(trust.folder, trust.roots, (key, {"valid_until": _fmt(later - timedelta(days=1))}), version=2,
                  expires=later + timedelta(days=30))
    f = verify(record, trust, now=later, tsa_certs=(ca,)).files[0]
    assert f.ok
    g = verify(str(other), trust, now=later, tsa_certs=(ca,)).files[0]
    assert not g.ok and any("does not verify over this signature" in n for n in g.step("signature").notes)


def test_a_token_under_an_untrusted_tsa_is_refused(stamped, tmp_path) -> None:
    _, key, trust, record, _ = stamped
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "ca.cnf").write_text(CONFIG)
    _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
          "ca.key", "-out", "ca.crt", "-days", "30", "-config", "ca.cnf", "-extensions", "v3_ca"], stranger)
    later = NOW + timedelta(days=300)
    write_targets(trust.folder, trust.roots, (key, {"valid_until": _fmt(later - timedelta(days=1))}), version=2,
                  expires=later + timedelta(days=30))
    f = verify(record, trust, now=later, tsa_certs=(str(stranger / "ca.crt"),)).files[0]
    assert not f.ok and any("timestamp token refused" in n for n in f.step("signature").notes)


def test_revocation_wins_over_a_timestamp(stamped) -> None:
    _, key, trust, record, ca = stamped
    write_targets(trust.folder, trust.roots, (key, {"revoked": True, "revoked_reason": "leaked"}), version=2)
    assert not verify(record, trust, tsa_certs=(ca,)).files[0].ok


def test_bad_tsa_certificate_is_a_usage_error(tmp_path) -> None:
    (tmp_path / "x.pem").write_text("nope")
    with pytest.raises(TimestampError, match="not a PEM certificate"):
        load_tsa_roots((str(tmp_path / "x.pem"),))


def _fmt(when) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
