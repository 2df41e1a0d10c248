"""`grpo-conform report`: verified records only, the three outputs, the committed page, Chromium."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import jsonschema
import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from browser import find_chromium, load_page
from grpo_conform.evidence import PAYLOAD_TYPE, keyid_of, pae
from grpo_conform.evidence.keys import public_pem
from grpo_conform.report.plot import mpl_version
from grpo_conform.report.build import REGENERATE, SWEEPS, ReportRequest, build_leaderboard
from grpo_conform.report.write import OUTPUTS, render, run_report

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "evidence" / "h200"
PAGE = ROOT / "evidence" / "leaderboard"
SCHEMA = json.loads((ROOT / "grpo_conform" / "schemas" / "leaderboard.v1.schema.json").read_text())
REPORTED = "tests/data/seed-records.csv"
AGAINST = "tests/data/liger-fused-linear-grpo.csv"  # Liger's own CSV: the documented command forwards it to the audit


def _payload(name: str) -> bytes:
    env = json.loads(next(COMMITTED.glob(f"{name}--nvidia-h200--20261130T*.intoto.json")).read_text())  # the seed-spec run
    return base64.b64decode(env["payload"])


def _own_record(payload: bytes, key: Ed25519PrivateKey, path: Path, tamper: bool = False, sign: bool = True) -> Path:
    """A committed statement (the exact signed bytes) signed again with a test key, so the tests do not
    depend on which key signed the committed records."""
    sigs = []
    if sign:
        sigs = [{"keyid": keyid_of(key.public_key()),
                 "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode()}]
    if tamper:  # one digit of a median changed after signing
        payload = payload.replace(b'"median_ns":1', b'"median_ns":2', 1)
    env = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(), "signatures": sigs}
    path.write_text(json.dumps(env))
    return path


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Three records signed by a test key (triton, liger, pytorch), one tampered, one unsigned."""
    d = tmp_path_factory.mktemp("records")
    key = Ed25519PrivateKey.generate()
    (d / "test.pub.pem").write_bytes(public_pem(key.public_key()))
    (d / "trusted-keys.json").write_text(json.dumps({"format": "grpo-conform/trusted-keys/v1", "keys": [
        {"keyid": keyid_of(key.public_key()), "public_key": "test.pub.pem", "owner": "report tests",
         "valid_from": "2026-01-01T00:00:00Z", "valid_until": None, "revoked": False}]}))
    good = d / "good"
    good.mkdir()
    for name in ("triton", "liger", "liger-inplace", "pytorch"):
        _own_record(_payload(name), key, good / f"{name}.intoto.json")
    _own_record(_payload("torch-compile"), key, d / "tampered.intoto.json", tamper=True)
    _own_record(_payload("torch-compile"), key, d / "unsigned.intoto.json", sign=False)
    return d


def test_only_verified_records_are_shown_and_the_others_say_why(own):
    board = build_leaderboard(ReportRequest(paths=(str(own / "good"), str(own / "tampered.intoto.json"),
                                                   str(own / "unsigned.intoto.json")),
                                            trusted_keys=str(own / "trusted-keys.json"), out=None))
    shown = {i.name for s in board.sections for h in (s, *s.history) for i in h.implementations}
    assert shown == {"triton", "liger", "liger-inplace", "pytorch"}
    why = {Path(r.path).name: r.reason for r in board.rejected}
    assert set(why) == {"tampered.intoto.json", "unsigned.intoto.json"}
    assert why["tampered.intoto.json"].startswith("signature:")
    assert "unsigned" in why["unsigned.intoto.json"]
    html = render(board, "html")
    assert "tampered.intoto.json" in html and "torch-compile" not in html.split('id="rejected"')[0]


def test_a_copy_of_a_record_counts_once_and_an_unknown_gpu_is_never_ranked(own, tmp_path):
    """Adversarial round 2026-12-05: a record copied under another name was counted again; a GPU the
    catalogue does not know (no floor could check its times) was ranked like the H200."""
    from grpo_conform.report.model import UNKNOWN_GPU

    key = Ed25519PrivateKey.generate()
    (tmp_path / "k.pub.pem").write_bytes(public_pem(key.public_key()))
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"format": "grpo-conform/trusted-keys/v1", "keys": [
        {"keyid": keyid_of(key.public_key()), "public_key": "k.pub.pem", "owner": "t",
         "valid_from": "2026-01-01T00:00:00Z", "valid_until": None, "revoked": False}]}))
    st = json.loads(_payload("triton"))
    hw = st["predicate"]["hardware"]
    hw["catalogue"], hw["device_name"], hw["device"]["name"] = None, "Acme Tensor 9", "Acme Tensor 9"
    a = _own_record(rfc8785.dumps(st), key, tmp_path / "a.intoto.json")
    b = tmp_path / "b.intoto.json"
    b.write_bytes(a.read_bytes())
    board = build_leaderboard(ReportRequest(paths=(str(a), str(b)), trusted_keys=str(keys), out=None))
    assert [(Path(r.path).name, r.reason.split(" (")[0]) for r in board.rejected] == [
        ("b.intoto.json", f"the same record as {a}")]
    (top,) = board.sections
    section = top.history[0] if top.history else top
    assert section.gpu == "Acme Tensor 9" + UNKNOWN_GPU and section.rows
    assert all(r.rank is None and "GPU the catalogue does not know" in r.flag for r in section.rows)


def test_a_record_rewritten_after_its_verification_is_shown_as_verified(own, tmp_path, monkeypatch):
    """The page shows the statement verification parsed from the signed bytes: a file swapped for another
    signed record (here: the tampered one's bytes) between verification and the page's own read never reaches
    the page, since there is no second read (load.py)."""
    from grpo_conform.report import load

    target = tmp_path / "triton.intoto.json"
    target.write_bytes((own / "good" / "triton.intoto.json").read_bytes())
    real = load.run_verify

    def verify_then_swap(request):
        report = real(request)
        target.write_bytes((own / "tampered.intoto.json").read_bytes())  # after every step passed
        return report

    monkeypatch.setattr(load, "run_verify", verify_then_swap)
    verified, rejected, _ = load.load_records((str(target),), str(own / "trusted-keys.json"))
    assert not rejected and len(verified) == 1
    assert verified[0].statement == json.loads(_payload("triton"))
    assert target.read_bytes() == (own / "tampered.intoto.json").read_bytes()  # the swap did happen


def test_a_spec_edited_between_verifications_is_resolved_again(tmp_path):
    """`find_spec_in` resolves once per state of the folder (names, sizes, mtimes): an edited member's new
    identity is seen by the next record's identity check, not the cached one."""
    from grpo_conform.spec.find import find_spec_in

    from conftest import ROOT

    specs = tmp_path / "specs"
    specs.mkdir()
    source = ROOT / "specs" / "grpo.v1.json"
    (specs / source.name).write_bytes(source.read_bytes())
    first = find_spec_in("grpo/token-is", specs)
    assert find_spec_in("grpo/token-is", specs) is first  # cached
    doc = json.loads(source.read_text())
    doc["summary"] += " (edited)"
    (specs / source.name).write_text(json.dumps(doc))
    again = find_spec_in("grpo/token-is", specs)
    assert again is not first


def test_ranks_vs_first_floor_ratio_and_the_non_conformant_one(own):
    board = build_leaderboard(ReportRequest(paths=(str(own / "good"),), trusted_keys=str(own / "trusted-keys.json"),
                                            out=None))
    (top,) = board.sections  # the seed spec's records are history of the member its id resolves to
    assert top.spec_id == "grpo/token-is" and top.current and not top.implementations
    (section,) = top.history
    assert section.gpu == "NVIDIA H200 SXM" and section.spec_id == "grpo-token-is" and not section.current
    full_b16 = {r.implementation: r for r in section.rows if r.protocol == "full" and r.batch == 16}
    assert full_b16["triton"].rank == 1 and full_b16["triton"].vs_first == 1.0
    assert full_b16["liger"].rank == 2 and full_b16["liger"].vs_first == pytest.approx(3.1133 / 2.2371, rel=1e-3)
    assert full_b16["liger-inplace"].rank is None  # fails no-mutation: shown, never ranked
    assert full_b16["triton"].measured_floor_ratio == pytest.approx(1.13, abs=0.01)
    assert full_b16["triton"].wall_ms > full_b16["triton"].median_ms > full_b16["triton"].floor_ms
    assert full_b16["pytorch"].peak_over_logits == pytest.approx(5.99, abs=0.01)
    md = render(board, "markdown")
    assert "| seed-b16 \\(batch 16\\) | 1 | triton | 2.2371" in md
    assert "fails no-aliasing, no-mutation, no-output-reuse" in md


def test_json_output_validates_against_its_schema_and_reported_records_are_explained(own):
    board = build_leaderboard(ReportRequest(paths=(str(own / "good"),), reported=(REPORTED,),
                                            trusted_keys=str(own / "trusted-keys.json"), out=None))
    doc = json.loads(render(board, "json"))
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    labels = {r["label"] for r in doc["reported"]["records"]}
    assert "not comparable" in labels  # fused linear + backward-only: another operation and protocol
    for r in doc["reported"]["records"]:
        assert r["explanation"], r
    for word in ("impossible", "not comparable", "plausible"):
        assert doc["reported"]["meanings"][word]
    broken = dict(doc, sections=[dict(doc["sections"][0], results=[{"median_ms": -1}])])
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail
        jsonschema.Draft202012Validator(SCHEMA).validate(broken)


def test_the_build_is_deterministic_and_writes_the_three_files(own, tmp_path):
    req = dict(paths=(str(own / "good"),), reported=(REPORTED,), trusted_keys=str(own / "trusted-keys.json"))
    a = run_report(ReportRequest(out=str(tmp_path / "a"), **req))
    b = run_report(ReportRequest(out=str(tmp_path / "b"), **req))
    assert sorted(Path(p).name for p in a.written) == sorted(OUTPUTS.values())
    for name in OUTPUTS.values():
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_committed_page_is_what_report_builds_from_the_committed_evidence(monkeypatch):
    """evidence/leaderboard/ must be rebuilt whenever evidence/h200 or evidence/h100 changes: see README (Results)."""
    monkeypatch.chdir(ROOT)
    board = build_leaderboard(ReportRequest(paths=("evidence/h200", "evidence/h100"), reported=(REPORTED,),
                                            against=AGAINST, out=None, sweeps=SWEEPS))
    assert f"--against {AGAINST}" in REGENERATE and all(f"--sweep {p}" in REGENERATE for p in SWEEPS)
    for fmt, name in OUTPUTS.items():
        committed, built = (PAGE / name).read_text(encoding="utf-8"), render(board, fmt)
        if fmt == "html" and f'data-matplotlib="{mpl_version()}"' not in committed:
            # Another matplotlib writes other SVG bytes for the same plot: compare everything else.
            committed, built = (re.sub(r"<svg.*?</svg>|data-matplotlib=\"[^\"]*\"", "", t, flags=re.S)
                                for t in (committed, built))
        assert committed == built, f"evidence/leaderboard/{name} is stale: run `{REGENERATE}`"


def test_html_is_self_contained():
    html = (PAGE / "index.html").read_text(encoding="utf-8")
    html = re.sub(r'xmlns(:xlink)?="http://www\.w3\.org/[^"]*"', "", html)  # namespace names, never fetched
    for needle in ("http://", "https://", "<script", "<link", "@import", "<img", "<iframe"):
        assert needle not in html, needle
    assert not re.search(r"url\((?!#)", html), "only in-page references (clip paths) may use url()"


CHROMIUM = find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)")
def test_the_page_loads_in_headless_chromium(tmp_path):
    page = load_page(CHROMIUM, PAGE / "index.html")
    assert page.errors == [] and page.failed == [], (page.errors, page.failed)
    assert all(u.startswith("file://") for u in page.requests), page.requests  # no network asset
    assert page.dom["timing_tables"] >= 1 and page.dom["tables"] >= 3
    assert page.dom["svgs"] >= 1 and "batch" in page.dom["svg_text"]
    assert page.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(page.screenshot) > 10_000
    (tmp_path / "leaderboard.png").write_bytes(page.screenshot)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)")
def test_the_browser_check_sees_errors_and_missing_assets(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="missing.png"><script>throw new Error("boom")</script>'
                   "</body></html>")
    page = load_page(CHROMIUM, bad)
    assert page.failed and any("boom" in e for e in page.errors)


def test_the_report_command(own, tmp_path):
    from click.testing import CliRunner

    from grpo_conform.cli import main

    args = ["report", str(own / "good"), str(own / "tampered.intoto.json"), "--trusted-keys",
            str(own / "trusted-keys.json"), "--out", str(tmp_path / "page")]
    text = CliRunner().invoke(main, args, catch_exceptions=False)
    assert text.exit_code == 0
    assert text.output.startswith("4 record(s) verified and shown in 1 section(s)")
    assert "not shown: " in text.output and "tampered.intoto.json: signature:" in text.output
    assert sorted(p.name for p in (tmp_path / "page").iterdir()) == sorted(OUTPUTS.values())
    doc = json.loads(CliRunner().invoke(main, args + ["--format", "json"], catch_exceptions=False).output)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    missing = CliRunner().invoke(main, ["report", str(tmp_path / "nothing-here")])
    assert missing.exit_code == 2 and "no such file or directory" in missing.output


def test_the_committed_page_shows_the_seed_member_once_with_triton_first_where_it_is_fastest():
    """Issue 29: the committed page showed Liger #1 at batch 16 and the seed member three times."""
    doc = json.loads((PAGE / "leaderboard.json").read_text())
    seed = [s for s in doc["sections"] if s["spec"]["id"] == "grpo/token-is"]
    gpus = [s["gpu"] for s in seed]
    assert len(gpus) == len(set(gpus)), gpus  # one section per GPU (H200, and H100 since the 27th session)
    (h200,) = [s for s in seed if s["gpu"] == "NVIDIA H200 SXM"]
    assert h200["current"] and len(h200["history"]) >= 1  # the H200 holds the seed's older identities
    assert all(s["spec"]["id"] not in ("grpo-token-is",) for s in doc["sections"])  # folded under it
    for section in seed:
        # Triton is first wherever it has records of the folder in this checkout; when the folder changed
        # after the last GPU run (2026-12-03: the interpreter twins), its records give no cell and say so.
        (triton,) = [i for i in section["implementations"] if i["name"] == "triton"]
        triton_current = not any("identity not in this checkout" in f for f in triton["flags"])
        for workload in ("seed-b2", "seed-b8", "seed-b16"):
            for protocol in ("full", "full-scaled", "forward"):
                rows = [r for r in section["results"] if r["workload"] == workload and r["protocol"] == protocol]
                if not rows:
                    assert section is not h200, (workload, protocol)  # the H200 section has every seed cell
                    continue
                fastest = min((r for r in rows if r["conformant"]), key=lambda r: r["median_ms"])
                first = next(r for r in rows if r["rank"] == 1)
                assert first is fastest, (section["gpu"], workload, protocol, first)
                if triton_current:
                    assert first["implementation"] == "triton", (section["gpu"], workload, protocol, first)
                else:  # its records name an older folder: no cell, and the page says why
                    assert all(r["implementation"] != "triton" for r in rows)


def test_plot_ids_depend_on_what_is_drawn_not_on_numpy_s_float_repr():
    """matplotlib hashes a clip rectangle's repr into its id (numpy 2 writes np.float64(...)): CI's numpy
    moved and the committed page's ids with it. Ids are renamed by order of first appearance under a
    prefix of the figure, so two figures of one page never share one."""
    from grpo_conform.report.plot import stable_ids

    def svg(clip, mark):
        return (f'<svg><defs><clipPath id="{clip}"><rect/></clipPath><path id="{mark}" d="M0 0"/></defs>'
                f'<g clip-path="url(#{clip})"><use xlink:href="#{mark}"/><use xlink:href="#{mark}"/></g>'
                f'<g style="fill: #1f77b4"/></svg>')

    one, two = svg("p2435a5c03b", "m0123456789"), svg("pcbacb085a0", "mabcdef0123")
    assert one != two and stable_ids(one, "a") == stable_ids(two, "a")
    out = stable_ids(one, "a")
    assert "p2435a5c03b" not in out and "#1f77b4" in out and out.count('url(#') == 1
    assert set(re.findall(r'id="([^"]+)"', out)).isdisjoint(re.findall(r'id="([^"]+)"', stable_ids(one, "b")))


def test_the_contents_name_each_section_s_first_and_why_a_section_has_none(own):
    """The page opens with one line per section: its hero's #1 (the same row), or why there is none; in HTML each
    line links to its section, and every link resolves."""
    from dataclasses import replace

    from grpo_conform.report import contents as C
    from grpo_conform.report.model import NOT_IN_TREE
    from grpo_conform.report.tables import first_by_protocol

    board = build_leaderboard(ReportRequest(paths=(str(own / "good"),), trusted_keys=str(own / "trusted-keys.json"),
                                            out=None))
    (top,) = board.sections
    assert C.rows(board.sections) == [("grpo/token-is on NVIDIA H200 SXM", "no verified record", "—", "—", "0 of 0")]
    old = top.history[0]  # a section with records: its line is its hero's #1
    best = first_by_protocol(old, "full")
    (line,) = C.rows([old])
    assert line[1] == f"{best.implementation} (batch {best.batch})" == "triton (batch 16)"
    assert line[2] == "2.2371" and line[3] == "1.13x" and line[4] == "3 of 4"  # liger-inplace is not conformant
    moved = replace(old, rows=(), implementations=tuple(replace(i, flags=(NOT_IN_TREE,)) for i in old.implementations))
    assert C.rows([moved])[0][1].startswith("no cell: records only of folder identities the checkout no longer has")
    assert C.rows([replace(old, rows=())])[0][1] == "no ranked cell (see the section)"
    # one implementation's records all of an older identity: the #1 stands, and the line names who was not ranked
    # (a faster kernel changed since its run must not read as beaten: twenty-fourth session)
    gone = next(i for i in old.implementations if i.name != best.implementation)
    part = replace(old, implementations=tuple(replace(i, flags=(NOT_IN_TREE,)) if i is gone else i
                                              for i in old.implementations))
    assert C.rows([part])[0][1] == (f"{best.implementation} (batch {best.batch}); not ranked: "
                                    f"{gone.label or gone.name} (records of older folder identities only)")
    html = render(board, "html")
    links = re.findall(r'<a href="#([^"]+)">', html.split('<nav id="contents">')[1].split("</nav>")[0])
    assert links and all(f'id="{a}"' in html for a in links)
    assert "## Contents" in render(board, "markdown")
