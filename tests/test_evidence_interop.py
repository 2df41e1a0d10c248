"""Other tools agree with us: openssl, securesystemslib's DSSE, and the documented shell recipes."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import shutil
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization

from grpo_conform.evidence import keygen, load_signing_key, write_record
from grpo_conform.evidence.dsse import PAYLOAD_TYPE, pae, parse_envelope
from grpo_conform.evidence.statement import PROJECT_ROOT, statement_bytes
from grpo_conform.implementations import load_implementation
from grpo_conform.spec import load_spec
from test_evidence_support import SPEC_FILE, new_key, synthetic_statement, trust, verify_one

README = PROJECT_ROOT / "evidence" / "README.md"
DOCS = PROJECT_ROOT / "docs" / "evidence.md"


def _openssl_reason() -> str | None:
    """Why the openssl cross-checks cannot run here, or None when they can."""
    if shutil.which("openssl") is None:
        return "openssl is not installed"
    helptext = subprocess.run(["openssl", "pkeyutl", "-help"], capture_output=True, text=True)
    if "-rawin" not in helptext.stdout + helptext.stderr:
        return "this openssl's pkeyutl has no -rawin (needs OpenSSL 3.0+)"
    algorithms = subprocess.run(["openssl", "list", "-public-key-algorithms"], capture_output=True, text=True)
    if "ED25519" not in algorithms.stdout.upper():
        return "this openssl has no Ed25519"
    return None


needs_openssl = pytest.mark.skipif(_openssl_reason() is not None, reason=str(_openssl_reason()))


@pytest.fixture()
def record(tmp_path):
    """A signed record made with a throw-away key: (record path, public key path, payload bytes)."""
    keygen(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    key = load_signing_key(tmp_path / "k.pem")
    path = tmp_path / "pytorch.intoto.json"
    write_record(synthetic_statement(), path, key)
    return path, tmp_path / "k.pub.pem", parse_envelope(path.read_bytes()).payload


@needs_openssl
def test_openssl_verifies_our_signature(tmp_path, record) -> None:
    path, pub, payload = record
    envelope = parse_envelope(path.read_bytes())
    (tmp_path / "pae.bin").write_bytes(pae(PAYLOAD_TYPE, payload))
    (tmp_path / "sig.bin").write_bytes(envelope.signatures[0].sig)
    cmd = ["openssl", "pkeyutl", "-verify", "-rawin", "-pubin", "-inkey", str(pub),
           "-sigfile", str(tmp_path / "sig.bin"), "-in", str(tmp_path / "pae.bin")]
    ok = subprocess.run(cmd, capture_output=True, text=True)
    assert ok.returncode == 0 and "Signature Verified Successfully" in ok.stdout
    (tmp_path / "pae.bin").write_bytes(pae(PAYLOAD_TYPE, payload + b" "))
    assert subprocess.run(cmd, capture_output=True).returncode != 0


@needs_openssl
def test_openssl_computes_our_key_id(record) -> None:
    _, pub, _ = record
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(pub), "-outform", "DER"],
                         capture_output=True, check=True).stdout
    assert hashlib.sha256(der).hexdigest() == parse_envelope(record[0].read_bytes()).signatures[0].keyid


def _recipe(record_path, key_path) -> str:
    text = README.read_text()
    block = re.search(r"<!-- openssl-recipe:begin -->\n```sh\n(.*?)```\n<!-- openssl-recipe:end -->", text, re.S)
    assert block, "the openssl recipe markers are missing from evidence/README.md"
    script = re.sub(r"^record=.*$", f"record='{record_path}'", block.group(1), count=1, flags=re.M)
    return re.sub(r"^key=.*$", f"key='{key_path}'", script, count=1, flags=re.M)


@needs_openssl
def test_readme_openssl_recipe_works(record) -> None:
    path, pub, payload = record
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", _recipe(path, pub)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "Signature Verified Successfully" in run.stdout
    assert hashlib.sha256(payload).hexdigest() in run.stdout


@needs_openssl
def test_readme_openssl_recipe_rejects_a_changed_record(record) -> None:
    path, pub, _ = record
    doc = json.loads(path.read_text())
    statement = json.loads(parse_envelope(path.read_bytes()).payload)
    statement["predicate"]["result"] = "FAILED"
    doc["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(doc))
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", _recipe(path, pub)], capture_output=True, text=True)
    assert run.returncode != 0 and "Signature Verified Successfully" not in run.stdout


# -- securesystemslib ---------------------------------------------------------------------------
def test_securesystemslib_verifies_our_envelope(record) -> None:
    dsse = pytest.importorskip("securesystemslib.dsse")
    from securesystemslib.signer import SSlibKey

    path, pub, payload = record
    doc = json.loads(path.read_text())
    theirs = dsse.Envelope.from_dict(copy.deepcopy(doc))  # from_dict empties the list it is given
    public_key = serialization.load_pem_public_key(pub.read_bytes())
    # Its verify only tries keys whose keyid equals the signature's, so give it ours.
    key = SSlibKey.from_crypto(public_key, keyid=doc["signatures"][0]["keyid"])
    assert key.keyid in theirs.verify([key], 1)
    assert theirs.payload == payload and theirs.payload_type == PAYLOAD_TYPE


def test_we_verify_a_securesystemslib_envelope(tmp_path) -> None:
    dsse = pytest.importorskip("securesystemslib.dsse")
    from securesystemslib.signer import CryptoSigner, SSlibKey

    key = new_key()
    signer = CryptoSigner(key.private_key, SSlibKey.from_crypto(key.public_key))  # its own keyid scheme
    envelope = dsse.Envelope(statement_bytes(synthetic_statement()), PAYLOAD_TYPE, {})
    envelope.sign(signer)
    path = tmp_path / "theirs.json"
    path.write_text(json.dumps(envelope.to_dict()))
    assert envelope.to_dict()["signatures"][0]["keyid"] != key.keyid
    f = verify_one(str(path), trust(tmp_path, (key, {})))
    assert f.ok, f.to_json()
    wrong = verify_one(str(path), trust(tmp_path, (new_key(), {}), name="other.json"))
    assert wrong.step("signature").status == "fail"


# -- the identities documented in docs/evidence.md --------------------------------------------
def _sh(command: str, cwd=PROJECT_ROOT) -> str:
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True, cwd=cwd)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()[0]


def test_documented_implementation_identity_command() -> None:
    text = DOCS.read_text()
    command = re.search(r"```sh\n(cd implementations/triton && find .*?)```", text, re.S).group(1)
    command = command.replace("implementations/triton", "implementations/pytorch")
    assert _sh(command) == load_implementation(PROJECT_ROOT / "implementations" / "pytorch").identity


def test_documented_spec_identity_command() -> None:
    text = DOCS.read_text()
    command = re.search(r"```sh\n(python3 -c .*?specs/grpo-token-is.v1.json \| sha256sum)\n```", text, re.S).group(1)
    command = command.replace("python3 ", f"'{sys.executable}' ", 1)  # the interpreter that has rfc8785
    assert _sh(command) == load_spec(SPEC_FILE).identity


def test_documented_record_identity_command(record) -> None:
    path, _, payload = record
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| record |"))
    command = re.search(r"`(python3 .*? R\.json .*?)`", row).group(1).replace("\\|", "|").replace("R.json", str(path))
    assert _sh(command) == hashlib.sha256(payload).hexdigest()
