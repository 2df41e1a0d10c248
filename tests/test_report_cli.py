"""Small things an author meets on the first day (issue 16, point 7), each with a test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_conform.cli import main

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "tests" / "data" / "seed-records.csv"
JSON = ROOT / "tests" / "data" / "seed-records.json"


def _run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# The audit tests below are about its lines and files, not the fused rows' reproduction from our records:
# `--no-reproduction`, or each audit verified the committed evidence/h200 again (~2-3 s CPU per file;
# docs/timing.md, "Eighth pass"). The reproduction: tests/test_audit_fused.py; from the committed
# records: tests/test_report.py's committed page (its reported rows) and test_cli's audit.
NO_REPRO = "--no-reproduction"


def test_audit_takes_several_files_one_compact_line_per_record():
    r = _run("audit", NO_REPRO, str(CSV), str(JSON))
    lines = r.output.splitlines()
    assert r.exit_code == 1  # some record is impossible
    assert lines[0].startswith("verdicts: IMPOSSIBLE = ") and "NOT COMPARABLE = " in lines[0]  # words defined first
    records = [ln for ln in lines if re.match(r"\S+:(\d+|records\[\d+\])  ", ln)]
    assert len(records) == 20  # 10 + 10, one line each
    for ln in records:
        if "IMPOSSIBLE" in ln and "not comparable" in ln:  # both words: each with its reason
            assert "impossible: " in ln and "x the floor" in ln and "and not comparable: " in ln
    assert lines[-1].startswith("20 record(s) in 2 file(s): ")
    verbose = _run("audit", NO_REPRO, "-v", str(CSV))
    assert "    physics: " in verbose.output or "      physics: " in verbose.output


def test_audit_lists_memory_rows_instead_of_dropping_them(tmp_path):
    rows = CSV.read_text().splitlines()
    memory = rows[1].replace(",speed,ms,", ",memory,MB,").replace(",1.81,", ",4096.5,")
    f = tmp_path / "with-memory.csv"
    f.write_text("\n".join([rows[0], rows[1], memory]) + "\n")
    r = _run("audit", NO_REPRO, str(f))
    assert re.search(r"with-memory.csv:3\s+NOT AUDITED\s+metric 'memory' \(MB\) is not a timing", r.output), r.output
    assert "1 non-timing row(s) (e.g. memory) not audited" in r.output
    doc = json.loads(_run("audit", NO_REPRO, "--format", "json", str(f)).output)
    assert len(doc["records"]) == 1 and len(doc["ignored"]) == 1


def test_audit_json_of_several_files():
    doc = json.loads(_run("audit", NO_REPRO, "--format", "json", str(CSV), str(JSON)).output)
    assert [Path(f["file"]).name for f in doc["files"]] == ["seed-records.csv", "seed-records.json"]
    assert doc["exit_code"] == 1


def test_spec_validate_reports_every_error(tmp_path):
    doc = json.loads((ROOT / "specs" / "grpo-token-is.v1.json").read_text())
    doc["version"], doc["bogus"], doc["inputs"][0]["dtypes"] = 3, 1, "x"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = _run("spec", "validate", str(bad), str(ROOT / "specs" / "grpo-token-is.v1.json"))
    assert r.exit_code == 2
    assert "INVALID (3 problem(s))" in r.output
    for where in ("$: Additional properties", "$.inputs[0].dtypes:", "$.version:"):
        assert where in r.output, where


def test_spec_show_groups_formula_inputs_outputs_constraints():
    r = _run("spec", "show", str(ROOT / "specs" / "grpo-token-is.v1.json"))
    assert r.exit_code == 0
    heads = [ln for ln in r.output.splitlines() if ln.endswith(":") and not ln.startswith(" ")]
    assert heads[:5] == ["Formula:", "Inputs:", "Outputs:", "Parameters:", "Constraints:"]


def test_spec_show_of_a_family_shows_every_member():
    family = ROOT / "specs" / "grpo.v1.json"
    if not family.is_file():
        pytest.skip("specs/grpo.v1.json not present")
    r = _run("spec", "show", str(family))
    assert r.exit_code == 0
    members = re.search(r"members:\s+(.*?) \(all of one", r.output).group(1).split(", ")
    assert r.output.count("Formula:") == len(members) and r.output.count("Outputs:") == len(members)


@pytest.mark.parametrize("literal", ["grpo-token-is 1.0.0", "grpo-token-is@1.0.0", "grpo-token-is",
                                     "specs/grpo-token-is.v1.json"])
def test_floor_accepts_the_spec_as_written_in_the_readme_and_printed_by_check(literal, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = _run("floor", "--spec", literal, "--workload", "seed-b2", "--gpu", "A100 80GB", "--protocol", "forward",
             "--model", "headroom-v1")
    assert r.exit_code == 0, r.output
    assert "257.9 us" in r.output


def test_bench_format_json_prints_json_when_it_refuses():
    import torch

    if torch.cuda.is_available():
        pytest.skip("bench runs on this machine: nothing is refused")
    r = _run("bench", str(ROOT / "implementations" / "pytorch"), "--format", "json")
    doc = json.loads(r.output)
    assert doc["ok"] is False and "CUDA" in doc["refused"] and r.exit_code == doc["exit_code"] == 3


def test_skip_messages_name_files_that_exist():
    named = set()
    for test in (ROOT / "tests").glob("test_*.py"):
        for msg in re.findall(r"(?:skip\(|reason=)\s*(?:f?\"([^\"]*)\"|f?'([^']*)')", test.read_text()):
            text = " ".join(msg)
            named |= set(re.findall(r"\b((?:docs|tests|benchmarks|evidence|specs)/[\w./-]+\.\w+)", text))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"skip messages point at files that do not exist: {missing}"


def test_keygen_says_how_to_trust_the_key_locally(tmp_path, monkeypatch):
    from grpo_conform.evidence import load_trusted_keys

    monkeypatch.chdir(tmp_path)
    r = _run("keygen")
    assert r.exit_code == 0, r.output
    snippet = next(ln.strip() for ln in r.output.splitlines() if ln.strip().startswith('{"format"'))
    listing = re.search(r"write (\S+) with:", r.output).group(1)
    Path(listing).write_text(snippet)
    (key,) = load_trusted_keys(listing)  # what keygen printed is a valid trusted-keys list for that key
    assert key.keyid in r.output
    assert f"grpo-conform verify --trusted-keys {listing}" in r.output
