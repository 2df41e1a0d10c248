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
from grpo_conform.spec import load_spec
from test_evidence_support import (SEED_SPEC, identity_of, make_project, make_trust_root, new_key, statement_for,
                                   trust_list, verify)

README = PROJECT_ROOT / "evidence" / "README.md"
COMMITTED = sorted((PROJECT_ROOT / "evidence" / "h200").glob("*--20261130T*.intoto.json"))  # the recipe default is from this run
MAINTAINERS_PUB = PROJECT_ROOT / "evidence" / "keys" / "maintainers-2026.pub.pem"
MAINTAINERS = "cc3e6bd1b854b6659c46050de1478a6a8acd761d05077e126fc8ea099a752d9c"
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
    write_record(statement_for(make_project(tmp_path / "proj")), path, key)
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


def _block(marker: str, lang: str) -> str:
    text = README.read_text()
    return re.search(rf"<!-- {marker}:begin -->\n```{lang}\n(.*?)```\n<!-- {marker}:end -->", text, re.S).group(1)


def _run_recipe(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The README's script saved to a file and run as the README says: `bash verify-record.sh RECORD [KEY]`."""
    script = tmp_path / "verify-record.sh"
    script.write_text(_block("openssl-recipe", "sh"))
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, cwd=PROJECT_ROOT)


def _tampered(tmp_path, change) -> str:
    doc = json.loads(COMMITTED[-1].read_text())
    change(doc)
    path = tmp_path / "tampered.intoto.json"
    path.write_text(json.dumps(doc))
    return str(path)


@needs_openssl
def test_readme_openssl_recipe_verifies_the_committed_record(tmp_path) -> None:
    run = _run_recipe(tmp_path)  # its defaults: the committed triton record and the committed key
    assert run.returncode == 0, run.stderr
    assert "Signature Verified Successfully" in run.stdout
    payload = parse_envelope(COMMITTED[-1].read_bytes()).payload
    assert f"record identity {hashlib.sha256(payload).hexdigest()}" in run.stdout


@needs_openssl
def test_readme_openssl_recipe_fails_on_a_changed_payload(tmp_path) -> None:
    def flip(doc):
        raw = bytearray(base64.b64decode(doc["payload"]))
        raw[100] ^= 1
        doc["payload"] = base64.b64encode(bytes(raw)).decode()
    run = _run_recipe(tmp_path, _tampered(tmp_path, flip))
    assert run.returncode != 0 and "Signature Verified Successfully" not in run.stdout


@needs_openssl
def test_readme_openssl_recipe_checks_the_payload_type(tmp_path) -> None:
    run = _run_recipe(tmp_path, _tampered(tmp_path, lambda d: d.update(payloadType="text/plain")))
    assert run.returncode != 0 and "FAIL: payloadType is text/plain" in run.stderr


@needs_openssl
def test_readme_openssl_recipe_refuses_a_swapped_key(tmp_path, record) -> None:
    path, pub, _ = record  # a record signed by another key, with that key's PEM beside it
    run = _run_recipe(tmp_path, str(path), str(pub))
    assert run.returncode != 0 and "expected cc3e6bd1" in run.stderr


def _run_sslib(tmp_path, record: str, pem: str, keyid: str) -> subprocess.CompletedProcess:
    script = tmp_path / "verify_sslib.py"
    script.write_text(_block("sslib-recipe", "python"))
    return subprocess.run([sys.executable, str(script), record, pem, keyid], capture_output=True, text=True,
                          cwd=PROJECT_ROOT)


@pytest.mark.parametrize("record", COMMITTED, ids=lambda p: p.name.split("--")[0])
def test_readme_securesystemslib_recipe_verifies_the_committed_records(tmp_path, record) -> None:
    pytest.importorskip("securesystemslib.dsse")
    run = _run_sslib(tmp_path, str(record), str(MAINTAINERS_PUB), MAINTAINERS)
    assert run.returncode == 0, run.stderr
    assert "verified; record identity" in run.stdout


def test_readme_securesystemslib_recipe_fails_on_tampering(tmp_path) -> None:
    pytest.importorskip("securesystemslib.dsse")
    def flip(doc):
        raw = bytearray(base64.b64decode(doc["payload"]))
        raw[100] ^= 1
        doc["payload"] = base64.b64encode(bytes(raw)).decode()
    run = _run_sslib(tmp_path, _tampered(tmp_path, flip), str(MAINTAINERS_PUB), MAINTAINERS)
    assert run.returncode != 0 and "verified" not in run.stdout
    run = _run_sslib(tmp_path, _tampered(tmp_path, lambda d: d.update(payloadType="x")), str(MAINTAINERS_PUB),
                     MAINTAINERS)
    assert run.returncode != 0 and "payloadType" in run.stderr


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
    project = make_project(tmp_path / "proj")
    envelope = dsse.Envelope(statement_bytes(statement_for(project)), PAYLOAD_TYPE, {})
    envelope.sign(signer)
    path = project / "theirs.json"
    path.write_text(json.dumps(envelope.to_dict()))
    assert envelope.to_dict()["signatures"][0]["keyid"] != key.keyid
    f = verify(str(path), make_trust_root(tmp_path / "t", (key, {}))).files[0]
    assert f.ok, f.to_json()
    wrong = verify(str(path), trust_list(tmp_path, (new_key(), {}), name="other.json")).files[0]
    assert wrong.step("signature").status == "fail"


# -- the identities documented in docs/evidence.md --------------------------------------------
def _sh(command: str, cwd=PROJECT_ROOT) -> str:
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True, cwd=cwd)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()[0]


def test_documented_implementation_identity_command(tmp_path) -> None:
    project = make_project(tmp_path / "proj")
    text = DOCS.read_text()
    command = re.search(r"```sh\n(cd implementations/triton && find .*?)```", text, re.S).group(1)
    command = command.replace("implementations/triton", "implementations/pytorch")
    assert _sh(command, cwd=project) == identity_of(project / "implementations" / "pytorch")


def test_documented_spec_identity_commands() -> None:
    text = DOCS.read_text()
    command = re.search(r"```sh\n(python3 -c .*?specs/grpo-token-is.v1.json \| sha256sum)\n```", text, re.S).group(1)
    command = command.replace("python3 ", f"'{sys.executable}' ", 1)  # the interpreter that has rfc8785
    assert _sh(command) == load_spec(SEED_SPEC).identity
    assert _sh("sha256sum specs/grpo-token-is.v1.json") == hashlib.sha256(SEED_SPEC.read_bytes()).hexdigest()


def test_documented_record_identity_command(record) -> None:
    path, _, payload = record
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| record |"))
    command = re.search(r"`(python3 .*? R\.json .*?)`", row).group(1).replace("\\|", "|").replace("R.json", str(path))
    assert _sh(command) == hashlib.sha256(payload).hexdigest()
