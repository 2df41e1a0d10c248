"""The mapping table (tests/peers/peer_mapping.py) against what cites and uses it; no extras needed,
runs in the fast lane: every member of the family has a row per trainer, the trainer adapters claim
only members whose row is Exact, and docs/spec-family.md points at the table."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest

from member_cases import member_names
from peer_mapping import MAPPING, TRAINERS, Exact, NotExpressible
from peer_draws import WHERE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("member", member_names())
def test_every_member_has_a_row_for_every_trainer(member):
    rows = MAPPING.get(member)
    assert rows is not None, f"tests/peers/peer_mapping.py: add a row for member {member}"
    assert set(rows) == set(TRAINERS), (member, sorted(rows))
    for trainer, row in rows.items():
        assert isinstance(row, (Exact, NotExpressible)), (member, trainer)
        if isinstance(row, NotExpressible):
            assert row.reason, (member, trainer)
            assert (row.where in WHERE) if row.nearest else not row.where, (member, trainer, row.where)


def test_rows_beyond_the_family_are_the_awaited_members():
    """Rows written for issue 33 item 1's members before they reach specs/grpo.v1.json (merge order):
    inert until then, so only these names may be ahead of the family."""
    awaited = {"token-offpolicy-mask-kl-bc", "vllm-token-mask", "vllm-sequence-truncate", "vllm-sequence-mask",
               "dapo-global-accum-mask", "sapo-mask", "luspo-mask", "luspo-sequence-mask", "vespo-mask"}
    assert set(MAPPING) - set(member_names()) <= awaited, sorted(set(MAPPING) - set(member_names()) - awaited)


@pytest.mark.parametrize("adapter, trainer", [("verl", "verl"), ("liger", "liger"), ("liger-inplace", "liger")])
def test_adapters_claim_only_exact_rows(adapter, trainer):
    manifest = tomllib.loads((ROOT / "implementations" / adapter / "implementation.toml").read_text())
    claimed = set(manifest["members"])
    exact = {m for m, rows in MAPPING.items() if isinstance(rows[trainer], Exact)}
    # issue 33 item 4: an adapter claims only what its trainer computes exactly (it may claim less: rows
    # for new members come before the adapter learns their configuration)
    assert claimed <= exact, f"implementations/{adapter} claims {sorted(claimed - exact)}: not exact in {trainer}"


def test_the_docs_cite_the_table():
    text = (ROOT / "docs" / "spec-family.md").read_text()
    assert "tests/peers/peer_mapping.py" in text
    for member in member_names():
        assert f"`{member}`" in text, member
