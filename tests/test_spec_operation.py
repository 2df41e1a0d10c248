"""The spec's optional `operation` field (issue 30 item 4): absent means grpo-logits and is no part of
any identity, so the frozen seed file and every family member keep the identities their committed
records name; a family sets it in `common` (a member may replace it); `operation_of` reads it."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path

import pytest
import rfc8785

from grpo_conform.spec import (
    DEFAULT_OPERATION, SpecError, find_spec, load_family, load_spec, operation_of, resolve_member_document,
    spec_from_document, validate_document,
)

ROOT = Path(__file__).resolve().parent.parent
SEED_FILE = ROOT / "specs" / "grpo-token-is.v1.json"
FAMILY_FILE = ROOT / "specs" / "grpo.v1.json"
SEED_IDENTITY = "a1591ee3a750b87738c7867f73e7e3300b6635eecca8229b45a7a1803e1c171f"
EVIDENCE = ROOT / "evidence" / "h200"


def _family_doc() -> dict:
    return json.loads(FAMILY_FILE.read_text(encoding="utf-8"))


def test_specs_without_the_field_are_grpo_logits_and_keep_their_identities():
    seed = load_spec(SEED_FILE)
    assert seed.operation is None and operation_of(seed) == DEFAULT_OPERATION == "grpo-logits"
    assert seed.identity == SEED_IDENTITY
    doc = _family_doc()
    assert "operation" not in doc["common"]
    for name in load_family(FAMILY_FILE).member_names:
        resolved = resolve_member_document(doc, name, FAMILY_FILE)
        assert "operation" not in resolved  # nothing added on the way: the hashed bytes are the file's
        spec = find_spec(f"grpo/{name}")
        assert spec.identity == hashlib.sha256(rfc8785.dumps(resolved)).hexdigest()
        assert operation_of(spec) == "grpo-logits"


def test_committed_records_name_the_identities_the_loader_gives_today():
    """For every committed record made from the spec file as it is now (same file sha256), the identity
    the record names is the one today's loader computes: the seed file and the family's members."""
    files = {hashlib.sha256(f.read_bytes()).hexdigest(): f for f in (SEED_FILE, FAMILY_FILE)}
    compared = set()
    for record in sorted(EVIDENCE.glob("*.intoto.json")):
        statement = json.loads(base64.b64decode(json.loads(record.read_text(encoding="utf-8"))["payload"]))
        spec = statement["predicate"]["spec"]
        # the 2026-11-30 seed records predate file_sha256: the seed file is frozen (test_spec_family pins it)
        file = files.get(spec.get("file_sha256", ""), SEED_FILE if spec["id"] == "grpo-token-is" else None)
        if file is None:
            continue  # made from another version of the file: its identity may differ, and should
        today = load_spec(file) if file == SEED_FILE else find_spec(f"grpo/{spec['member']}")
        assert today.identity == spec["identity"], (record.name, spec)
        compared.add(spec["id"])
    assert "grpo-token-is" in compared  # the frozen seed file's records at least (it never changes)


def test_a_family_sets_the_operation_in_common_and_a_member_may_replace_it(tmp_path):
    doc = _family_doc()
    doc["common"]["operation"] = "fused-linear-grpo"
    doc["members"][1]["operation"] = "other-op"
    validate_document(doc, "family.json")
    first, second = doc["members"][0]["name"], doc["members"][1]["name"]
    a = spec_from_document(resolve_member_document(doc, first, "family.json"), "family.json")
    b = spec_from_document(resolve_member_document(doc, second, "family.json"), "family.json")
    assert (operation_of(a), operation_of(b)) == ("fused-linear-grpo", "other-op")
    assert a.identity != find_spec(f"grpo/{first}").identity  # present, it is part of the identity


def test_an_operation_that_is_not_a_name_is_refused_at_its_path():
    seed = json.loads(SEED_FILE.read_text(encoding="utf-8"))
    bad = copy.deepcopy(seed)
    bad["operation"] = "GRPO logits"
    with pytest.raises(SpecError) as err:
        spec_from_document(bad, "seed.json")
    assert err.value.path == "$.operation"
    doc = _family_doc()
    doc["common"]["operation"] = 3
    with pytest.raises(SpecError) as err:
        validate_document(doc, "family.json")
    assert err.value.path == "$.common.operation"
