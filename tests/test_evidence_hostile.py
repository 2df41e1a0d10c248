"""Hostile input: terminal escapes, size caps, deep nesting, and one bad file never hiding the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_conform.evidence import safe
from grpo_conform.evidence.dsse import loads_strict
from test_evidence_support import make_project, make_trust_root, new_key, signed_record, statement_for, verify

ESC, RLO, ZWSP, BOM = "\x1b[2J\x1b]0;owned\x07", "\u202e", "\u200b", "\ufeff"


@pytest.fixture()
def env(tmp_path):
    project = make_project(tmp_path / "proj")
    key = new_key()
    return project, key, make_trust_root(tmp_path / "trust", (key, {}))


@pytest.mark.parametrize("text", [ESC, RLO + "gpj.exe", "a" + ZWSP + "b", BOM + "x", "\u2066x\u2069", "\x9b31m",
                                  "line\u2028two"])
def test_safe_escapes_every_invisible_or_controlling_character(text) -> None:
    shown = safe(text)
    assert all(ch.isprintable() and ch not in "\u202e\u200b\ufeff\u2066\u2069\u2028" for ch in shown), shown
    assert "\\u{" in shown


def test_safe_keeps_plain_unicode_and_marks_backslashes() -> None:
    assert safe("H200 – ½ ünï") == "H200 – ½ ünï"
    assert safe("a\\u{1B}") == "a\\\\u{1B}"  # a literal backslash cannot fake an escape


def test_hostile_strings_in_a_record_never_reach_the_terminal(env) -> None:
    project, key, trust = env
    st = statement_for(project)
    st["predicate"]["message"] = ESC
    st["predicate"]["hardware"]["device"]["name"] = RLO + "H200" + ZWSP
    st["predicate"]["workloads"][0]["checks"][0]["message"] = ESC
    path = signed_record(project / "evidence" / f"x{RLO}y.intoto.json", st, key)
    report = verify(path, trust)
    text = "\n".join(report.lines())
    # refused since 2026-12-05: a hardware name outside printable ASCII can pass for another GPU (gpu_named.py)
    assert not report.files[0].ok and report.files[0].step("semantics").status == "fail"
    for bad in ("\x1b", RLO, ZWSP):
        assert bad not in text
    assert "outside printable ASCII" in text


def test_hostile_names_are_refused_by_the_schema(env) -> None:
    project, key, trust = env
    st = statement_for(project)
    st["predicate"]["workloads"][0]["workload"] = "seed" + ESC
    f = verify(signed_record(project / "evidence" / "n.json", st, key), trust).files[0]
    assert f.step("schema").status == "fail"


def test_oversized_file_is_refused_without_reading_it(env, tmp_path) -> None:
    big = tmp_path / "big.intoto.json"
    with open(big, "wb") as fh:  # sparse: 150 MB on paper, nothing on disk
        fh.truncate(150 * 2**20)
    f = verify(str(big), env[2]).files[0]
    assert f.step("envelope").status == "fail" and "refused" in f.step("envelope").message


def test_oversized_payload_is_refused(env, monkeypatch) -> None:
    import grpo_conform.evidence.verify as v

    project, key, trust = env
    monkeypatch.setattr(v, "MAX_PAYLOAD_BYTES", 1000)
    f = verify(signed_record(project / "evidence" / "p.json", statement_for(project), key), trust).files[0]
    assert f.step("envelope").status == "fail" and "payload of" in f.step("envelope").message


def test_too_many_signatures_are_refused(env) -> None:
    project, key, trust = env
    path = Path(signed_record(project / "evidence" / "s.json", statement_for(project), key))
    doc = json.loads(path.read_text())
    doc["signatures"] = doc["signatures"] * 40
    path.write_text(json.dumps(doc))
    f = verify(str(path), trust).files[0]
    assert "at most 16" in f.step("envelope").message


def test_deep_nesting_is_refused_and_the_other_files_are_still_reported(env, tmp_path) -> None:
    project, key, trust = env
    deep = tmp_path / "deep.intoto.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    deep_payload = signed_record(project / "evidence" / "dp.json", b'{"a":' * 5000 + b"1" + b"}" * 5000, key)
    good = signed_record(project / "evidence" / "good.json", statement_for(project), key)
    report = verify([str(deep), deep_payload, str(tmp_path / "missing.json"), good], trust)
    f = report.files
    assert [x.ok for x in f] == [False, False, False, True]
    assert "nested too deeply" in f[0].step("envelope").message
    assert "nested too deeply" in f[1].step("schema").message
    assert report.exit_code == 1


def test_loads_strict_depth_limit() -> None:
    assert loads_strict(b"[[1]]") == [[1]]
    with pytest.raises(ValueError, match="nested too deeply"):
        loads_strict(b"[" * 70 + b"]" * 70)


def test_cli_json_output_always_prints_for_hostile_files(env, tmp_path) -> None:
    project, key, trust = env
    deep = tmp_path / "deep.intoto.json"
    deep.write_text("{\"a\":" * 200_000)
    garbage = tmp_path / "garbage.intoto.json"
    garbage.write_bytes(os.urandom(3000))
    cmd = [sys.executable, "-m", "grpo_conform", "verify", str(deep), str(garbage), str(tmp_path),
           "--trust-root", str(trust.folder), "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    doc = json.loads(done.stdout)
    assert done.returncode == 1 and [f["ok"] for f in doc["files"]] == [False, False, False]
    assert "Traceback" not in done.stderr
