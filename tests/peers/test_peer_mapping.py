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


def test_no_row_for_a_member_the_family_lacks():
    assert set(MAPPING) <= set(member_names()), sorted(set(MAPPING) - set(member_names()))


@pytest.mark.parametrize("adapter, trainer", [("verl", "verl"), ("liger", "liger"), ("liger-inplace", "liger")])
def test_adapters_claim_only_exact_rows(adapter, trainer):
    manifest = tomllib.loads((ROOT / "implementations" / adapter / "implementation.toml").read_text())
    claimed = set(manifest["members"])
    exact = {m for m, rows in MAPPING.items() if isinstance(rows[trainer], Exact)}
    assert claimed <= exact, f"implementations/{adapter} claims {sorted(claimed - exact)}: not exact in {trainer}"
    if adapter == "verl":  # issue 33 item 4: the adapter claims everything verl computes exactly, nothing else
        assert claimed == exact, sorted(exact - claimed)


def test_the_docs_cite_the_table():
    text = (ROOT / "docs" / "spec-family.md").read_text()
    assert "tests/peers/peer_mapping.py" in text
    for member in MAPPING:
        assert f"`{member}`" in text, member
