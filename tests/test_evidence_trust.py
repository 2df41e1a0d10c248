"""The trust root: shipped with the package, extended only by metadata the root keys signed.

Attacks from issue 12: a pull request that adds its own key (to the committed list, or as a PEM
swapped in the tree), a key listed by an unsigned file, a root rotated without the old keys, an
expired root, a revoked key, an expired key back-dating its record; and the documented rotation
recovery (re-sign with the new key), which must work.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import timedelta

import pytest

from grpo_conform.errors import EXIT_FAILED
from grpo_conform.evidence import (PINNED_ROOT_KEYIDS, TrustedKeysError, VerifyRequest, load_trust_root, run_verify,
                                   sign_record, write_record)
from grpo_conform.evidence.keys import keyid_of, public_pem
from grpo_conform.evidence.statement import PROJECT_ROOT
from grpo_conform.evidence.trust import shipped_trust_dir
from grpo_conform.evidence.trust_build import build_root, sign_metadata, write_metadata
from test_evidence_support import (
    NOW,
    make_project,
    make_trust_root,
    new_key,
    statement_for,
    trust_list,
    verify,
    write_targets,
)

MAINTAINERS = "cc3e6bd1b854b6659c46050de1478a6a8acd761d05077e126fc8ea099a752d9c"


@pytest.fixture()
def setup(tmp_path):
    project = make_project(tmp_path / "proj")
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    record = project / "evidence" / "r.intoto.json"
    write_record(statement_for(project), record, key)
    return project, key, trust, str(record)


def _statuses(f) -> dict[str, str]:
    return {s.step: s.status for s in f.steps}


def test_shipped_root_names_the_maintainers_key_and_is_pinned() -> None:
    trust = load_trust_root()
    assert not trust.override and "shipped trust root" in trust.source
    assert [k.keyid for k in trust.keys if not k.revoked] == [MAINTAINERS]
    root = json.loads((shipped_trust_dir() / "1.root.json").read_text())["signed"]
    assert set(root["roles"]["root"]["keyids"]) == PINNED_ROOT_KEYIDS
    assert root["roles"]["root"]["threshold"] == 2 and root["roles"]["targets"]["threshold"] == 2
    assert not any("PRIVATE" in p.read_text() for p in shipped_trust_dir().iterdir())


def test_shipped_root_has_only_public_material_in_the_package_data() -> None:
    names = sorted(p.name for p in shipped_trust_dir().iterdir())
    assert names == ["1.root.json", "targets.json"]


def test_valid_record_verifies_under_a_signed_root(setup) -> None:
    _, key, trust, record = setup
    f = verify(record, trust).files[0]
    assert f.ok, f.steps
    assert f.signers[0]["keyid"] == key.keyid


def test_pr_added_key_in_the_committed_list_is_not_trusted(tmp_path) -> None:
    """The audit's attack: a PR adds its key to evidence/keys/trusted-keys.json with the maintainers'
    name, and runs verify from the checkout. The list is never read by default."""
    project = make_project(tmp_path / "proj")
    attacker = new_key()
    keys = project / "evidence" / "keys"
    keys.mkdir(parents=True)
    trust_list(keys, (attacker, {"owner": "grpo-conform maintainers"}), name="trusted-keys.json")
    record = project / "evidence" / "forged.intoto.json"
    write_record(statement_for(project), record, attacker)
    done = subprocess.run([sys.executable, "-m", "grpo_conform", "verify", str(record)], cwd=project,
                          capture_output=True, text=True)
    assert done.returncode == EXIT_FAILED, done.stdout
    assert "none of the 1 signature(s) verifies" in done.stdout
    assert "shipped trust root" in done.stdout and "signed by grpo-conform maintainers" not in done.stdout


def test_swapped_pem_in_the_tree_changes_nothing(tmp_path) -> None:
    """Replacing evidence/keys/maintainers-2026.pub.pem in a copy of the checkout with an attacker's key:
    verify does not read it, so the attacker's record is refused and trust is the pinned root."""
    project = make_project(tmp_path / "proj")
    attacker = new_key()
    (project / "evidence" / "keys").mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "evidence" / "keys" / "trusted-keys.json", project / "evidence" / "keys")
    (project / "evidence" / "keys" / "maintainers-2026.pub.pem").write_bytes(public_pem(attacker.public_key))
    record = project / "evidence" / "forged.intoto.json"
    write_record(statement_for(project), record, attacker)
    f = run_verify(VerifyRequest((str(record),), project=str(project), now=NOW)).files[0]
    assert _statuses(f)["signature"] == "fail"


def test_a_key_listed_by_an_unsigned_targets_file_is_refused(setup, tmp_path) -> None:
    _, _, trust, record = setup
    attacker = new_key()
    doc = json.loads((trust.folder / "targets.json").read_text())
    doc["signed"]["delegations"]["keys"][attacker.keyid] = {
        "keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": attacker.public_key.public_bytes_raw().hex()}}
    doc["signed"]["delegations"]["roles"][0]["keyids"].append(attacker.keyid)
    (trust.folder / "targets.json").write_text(json.dumps(doc))
    with pytest.raises(TrustedKeysError, match="not signed by a threshold of the targets keys"):
        verify(record, trust)


def test_targets_signed_by_one_root_key_of_two_is_refused(setup) -> None:
    _, key, trust, record = setup
    write_targets(trust.folder, trust.roots[:1], (key, {}), version=2)
    with pytest.raises(TrustedKeysError, match="threshold"):
        verify(record, trust)


def test_root_not_matching_the_pinned_keys_is_refused(setup) -> None:
    _, _, trust, _ = setup
    with pytest.raises(TrustedKeysError, match="not the pinned root keys"):
        load_trust_root(trust.folder, now=NOW)  # pinned = the shipped ids
    assert load_trust_root(trust.folder, pinned=trust.pinned, now=NOW).keys


def test_one_root_key_cannot_make_a_root_of_its_own(setup, tmp_path) -> None:
    """Adversarial round 2026-12-05: version 1 naming one of the two pinned keys (threshold 1), or both
    with threshold 1, let one root key holder delegate `evidence` to any key; both are refused."""
    _, key, trust, record = setup
    one = tmp_path / "one"
    one.mkdir()
    v1 = build_root(1, [trust.roots[0].public_key()], 1, NOW + timedelta(days=90))
    write_metadata(sign_metadata(v1, trust.roots[:1]), one / "1.root.json")
    write_targets(one, trust.roots[:1], (key, {}))
    with pytest.raises(TrustedKeysError, match="not the pinned root keys"):
        load_trust_root(one, pinned=trust.pinned, now=NOW)
    v1 = build_root(1, [k.public_key() for k in trust.roots], 1, NOW + timedelta(days=90))
    write_metadata(sign_metadata(v1, trust.roots[:1]), one / "1.root.json")
    with pytest.raises(TrustedKeysError, match="threshold is 1; this release requires at least 2"):
        load_trust_root(one, pinned=trust.pinned, now=NOW)
    # a later version signed by both keys may not lower the threshold either
    v2 = build_root(2, [k.public_key() for k in trust.roots], 1, NOW + timedelta(days=90))
    write_metadata(sign_metadata(v2, trust.roots), trust.folder / "2.root.json")
    with pytest.raises(TrustedKeysError, match="root version 2: the root role's threshold is 1"):
        load_trust_root(trust.folder, pinned=trust.pinned, now=NOW)
    assert load_trust_root(trust.folder, pinned=None, now=NOW).keys  # an explicit override judges nothing


def test_rotated_root_needs_the_old_keys(setup) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _, key, trust, record = setup
    new_roots = [Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()]
    v2 = build_root(2, [k.public_key() for k in new_roots], 2, NOW + timedelta(days=90))
    write_metadata(sign_metadata(v2, new_roots), trust.folder / "2.root.json")  # only the new keys sign
    with pytest.raises(TrustedKeysError, match="root version 2 .by the keys of version 1"):
        verify(record, trust)
    v2 = build_root(2, [k.public_key() for k in new_roots], 2, NOW + timedelta(days=90))
    write_metadata(sign_metadata(v2, [*trust.roots, *new_roots]), trust.folder / "2.root.json")
    with pytest.raises(TrustedKeysError, match="targets"):  # targets still signed by the old keys only
        verify(record, trust)
    write_targets(trust.folder, new_roots, (key, {}), version=2)
    assert verify(record, trust).files[0].ok


def test_expired_root_and_targets_are_refused(setup) -> None:
    _, _, trust, record = setup
    with pytest.raises(TrustedKeysError, match="expired"):
        verify(record, trust, now=NOW + timedelta(days=400))


def test_revoked_key_is_refused_whatever_the_record_says(setup) -> None:
    _, key, trust, record = setup
    write_targets(trust.folder, trust.roots, (key, {"revoked": True, "revoked_reason": "laptop stolen"}), version=2)
    f = verify(record, trust).files[0]
    assert _statuses(f)["signature"] == "fail" and "laptop stolen" in f.step("signature").message


def test_expired_key_cannot_back_date(setup, tmp_path) -> None:
    """The key's window ended before now: a record whose run.finished lies inside the window is still
    refused, because the signer writes run.finished."""
    project, key, trust, record = setup
    write_targets(trust.folder, trust.roots, (key, {"valid_until": "2026-12-01T11:00:00Z"}), version=2)
    f = verify(record, trust).files[0]  # NOW is 12:00, the record finished at 10:00:05
    assert _statuses(f)["signature"] == "fail"
    assert "re-sign the record with a current key" in f.step("signature").message


def test_documented_rotation_recovery_works(setup) -> None:
    """docs/evidence.md, Rotation: add the new key, end the old one, re-sign with `sign`."""
    project, old, trust, record = setup
    new = new_key()
    write_targets(trust.folder, trust.roots, (old, {"valid_until": "2026-12-01T11:00:00Z"}),
                  (new, {}), version=2)
    assert not verify(record, trust).files[0].ok
    sign_record(record, new)
    f = verify(record, trust).files[0]
    assert f.ok, f.steps
    assert [s["keyid"] for s in f.signers] == [new.keyid]


def test_trusted_keys_override_says_so(setup, tmp_path) -> None:
    _, key, _, record = setup
    report = verify(record, trust_list(tmp_path, (key, {})))
    assert report.files[0].ok and report.trust_override
    assert report.lines()[0].startswith("TRUST OVERRIDE: keys from --trusted-keys")


def test_trust_root_override_says_so(setup) -> None:
    _, _, trust, record = setup
    report = verify(record, trust)
    assert report.trust_override and report.lines()[0].startswith("TRUST OVERRIDE: override --trust-root")


def test_trust_tool_regenerates_metadata(tmp_path) -> None:
    """tools/trust-root.py, as a maintainer runs it, with throw-away root keys."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pems = []
    for i in range(2):
        k = Ed25519PrivateKey.generate()
        p = tmp_path / f"root{i}.pem"
        p.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        pems += ["--root-key", str(p)]
    ev = new_key()
    keys = trust_list(tmp_path, (ev, {}))
    tool = [sys.executable, str(PROJECT_ROOT / "tools" / "trust-root.py")]
    out = tmp_path / "trust"
    for args in (["root", *pems, "--dir", str(out)], ["targets", *pems, "--keys", keys, "--dir", str(out)]):
        done = subprocess.run([*tool, *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    root = load_trust_root(out, pinned=None)
    assert [k.keyid for k in root.keys] == [ev.keyid]
    assert keyid_of(ev.public_key) == ev.keyid
