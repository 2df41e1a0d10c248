"""`grpo-conform report --sweep`: the logits kernel's shape sweep on the page (issue 36), read as unsigned
benchmark output: floors recomputed, derived fields ignored, impossible times flagged, hostile text inert."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from grpo_conform.report.build import SWEEPS, ReportRequest, build_leaderboard
from grpo_conform.report.markdown import render_markdown
from grpo_conform.report.sweep import SweepInputError, SweepRow, floor_ms, judge_run, load_sweeps
from grpo_conform.report.sweep_tables import grids, identity_text

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "grpo_conform" / "schemas" / "leaderboard.v1.schema.json").read_text())
COPY_TBPS = 4.3
MEMBERS = ("token-is", "token-offpolicy-mask", "sequence-offpolicy-mask")


def _row(vocab, batch, member, x, seq=1024, dtype="bfloat16", liger=None, unmasked=0.75, **extra):
    """A row whose floor follows from its shape (as sweep_logits.py writes it) and whose time is x the floor."""
    r = {"vocab": vocab, "batch": batch, "seq": seq, "dtype": dtype, "member": member, "unmasked_fraction": unmasked,
         "note": ""}
    floor = floor_ms(SweepRow(**r), COPY_TBPS * 1e12)
    r.update(floor_ms=floor, ours_ms=x * floor, **extra)
    if liger:
        r["liger_ms"] = liger * x * floor
    return r


def _doc(rows, started="2026-12-03T10:00:00Z", gpu="NVIDIA H200", launch=(), **meta):
    return {"meta": {"gpu": gpu, "torch": "2.11", "triton": "3.6", "copy_TBps": COPY_TBPS, "started": started, **meta},
            "rows": list(rows), "launch": list(launch)}


def _write(tmp_path, name, doc) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _seed_rows(x_token=1.10, x_masked=1.11, x_gspo=1.30, liger=1.4, vocab=128256, batch=8):
    return [_row(vocab, batch, "token-is", x_token, liger=liger), _row(vocab, batch, "token-offpolicy-mask", x_masked,
            liger=liger), _row(vocab, batch, "sequence-offpolicy-mask", x_gspo, liger=liger)]


def load_sweep(paths, current_identity=None):
    """The one sweep of files that all name one GPU (or none that could be read)."""
    (sweep,) = load_sweeps(paths, current_identity)
    return sweep


def _targets(sweep) -> dict:
    """Each target by its first word (token, seed, GSPO, never, launch-bound)."""
    return {t.name.split(" ")[0]: t for t in sweep.targets}


def test_targets_met_and_missed_over_the_merged_rows(tmp_path):
    good = load_sweep((_write(tmp_path, "a.json", _doc(_seed_rows(x_gspo=1.2))),))
    assert all(t.met for t in good.targets) and len(good.targets) == 4  # no launch rows: no launch target
    bad = load_sweep((_write(tmp_path, "b.json", _doc(_seed_rows(x_token=1.13, x_gspo=1.60, liger=0.9),
                                                      launch=[{"impl": "ours", "member": "token-is", "full_wall_ms": 0.2}])),))
    t = _targets(bad)
    assert t["token"].met and not t["seed"].met and "1.130x" in t["seed"].worst  # 1.13: under 1.15, over 1.12
    assert not t["GSPO"].met and "x at V128256 b8" in t["GSPO"].worst
    assert not t["never"].met and t["never"].passed == 0
    assert not t["launch-bound"].met and "0.2000 ms" in t["launch-bound"].worst


def test_a_file_s_own_conclusions_change_nothing(tmp_path):
    """An edited ratio, speed-up or verdict list is ignored: every number the page shows is formed here."""
    rows = _seed_rows(x_token=1.30)
    edited = [dict(r, ours_x_floor=1.0, speedup_vs_liger=9.0) for r in rows]
    doc = dict(_doc(edited), verdicts=["PASS  everything"])
    sweep = load_sweep((_write(tmp_path, "e.json", doc),))
    cell = next(c for c in sweep.cells if c.member == "token-is")
    assert cell.x_floor == pytest.approx(1.30) and cell.vs_liger == pytest.approx(1.4)
    assert not _targets(sweep)["token"].met


def test_a_floor_that_does_not_follow_from_the_shape_is_set_aside(tmp_path):
    """A lowered copy bandwidth or an edited floor_ms would make a slow kernel look close to its floor."""
    rows = _seed_rows(x_token=1.30)
    rows[0]["floor_ms"] *= 1.2  # ours now "1.08x"
    sweep = load_sweep((_write(tmp_path, "f.json", _doc(rows)),))
    assert [c.member for c in sweep.cells] == ["token-offpolicy-mask", "sequence-offpolicy-mask"]
    where, why = sweep.set_aside[0]
    assert "V128256 b8 s1024 bfloat16 token-is" in where and "does not follow from the shape" in why
    masked = _seed_rows()[1:2]
    del masked[0]["unmasked_fraction"]  # a masked member's floor needs the unmasked share
    sweep = load_sweep((_write(tmp_path, "g.json", _doc(masked)),))
    assert not sweep.cells and "without unmasked_fraction" in sweep.set_aside[0][1]


def test_a_time_below_the_datasheet_floor_is_impossible_and_left_out_of_the_targets(tmp_path):
    # the run claims a slow copy (2 TB/s), so its stated floor is large; the H200's datasheet floor is 4.8 TB/s
    slow = 2.0
    r = {"vocab": 128256, "batch": 8, "seq": 1024, "dtype": "bfloat16", "member": "token-is", "note": ""}
    floor = floor_ms(SweepRow(**r), slow * 1e12)
    r.update(floor_ms=floor, ours_ms=0.3 * floor)  # 0.63 ms: under the 0.88 ms that 4.8 TB/s allows
    doc = _doc([r])
    doc["meta"]["copy_TBps"] = slow
    sweep = load_sweep((_write(tmp_path, "i.json", doc),))
    assert sweep.cells[0].impossible and sweep.targets == ()
    assert "impossible" in grids(sweep)[0][2][0][1]
    plausible = load_sweep((_write(tmp_path, "p.json", _doc(_seed_rows())),))
    assert not any(c.impossible for c in plausible.cells)
    # a GPU the catalogue cannot resolve, or a look-alike of one (Cyrillic "Н"), would leave every time unflagged:
    # such cells are never judged, and a look-alike name sets the file aside (adversarial round, 2026-12-05)
    fast = doc  # the row above, at its slow copy bandwidth
    unknown = load_sweep((_write(tmp_path, "u.json", {**fast, "meta": {**fast["meta"], "gpu": "Some Future GPU"}}),))
    assert unknown.cells[0].datasheet_floor_ms is None and unknown.targets == ()  # shown, never judged
    alike = load_sweep((_write(tmp_path, "a.json", {**fast, "meta": {**fast["meta"], "gpu": "NVIDIA \u041d200"}}),))
    assert alike.cells == () and "outside printable ASCII" in alike.set_aside[0][1], alike.set_aside


def test_files_merge_by_shape_the_newest_whole(tmp_path):
    old = _doc(_seed_rows(x_token=1.30) + _seed_rows(x_token=1.40, batch=2), started="2026-12-01T00:00:00Z")
    new = _doc(_seed_rows(x_token=1.10)[:1], started="2026-12-02T00:00:00Z")  # b8 again, token-is only
    sweep = load_sweep((_write(tmp_path, "new.json", new), _write(tmp_path, "old.json", old)))
    b8 = [c for c in sweep.cells if c.batch == 8]
    assert [(c.member, round(c.x_floor, 2), c.source) for c in b8] == [("token-is", 1.1, 0)]  # the newest, whole
    assert {c.member for c in sweep.cells if c.batch == 2} == set(MEMBERS)  # the older file's other shape stays
    assert [len(r) for _, _, r in grids(sweep)][:1] == [2]


def test_bad_files_are_named_and_set_aside(tmp_path):
    with pytest.raises(SweepInputError, match="--sweep .*nope.json: no such file"):
        load_sweep((str(tmp_path / "nope.json"),))
    with pytest.raises(SweepInputError, match="a folder, not a file"):
        load_sweep((str(tmp_path),))
    bad = _doc(_seed_rows())
    bad["rows"][0]["member"] = "made-up"
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    sweep = load_sweep((_write(tmp_path, "bad.json", bad), str(junk), _write(tmp_path, "ok.json", _doc(_seed_rows()))))
    reasons = dict(sweep.set_aside)
    assert "field rows.0.member" in reasons[str(tmp_path / "bad.json")]
    assert "not JSON" in reasons[str(junk)]
    assert len(sweep.files) == 1 and len(sweep.cells) == 3


def test_identity_is_named_current_or_not(tmp_path):
    ident = "a" * 64
    sweep = load_sweep((_write(tmp_path, "i.json", _doc(_seed_rows(), identity=ident)),), current_identity=ident)
    assert "(current)" in identity_text(sweep, sweep.files[0].meta.identity)
    other = load_sweep((_write(tmp_path, "j.json", _doc(_seed_rows(), identity=ident)),), current_identity="b" * 64)
    assert "not the checkout's" in identity_text(other, other.files[0].meta.identity)
    assert "not recorded" in identity_text(other, None)


def test_hostile_text_is_inert_on_the_page(tmp_path):
    rows = _seed_rows()
    rows[0].update(note="[click](https://evil.example) <script>x</script>", ours_ms=None)  # shown with its note
    doc = _doc(rows, gpu="H200 <img src=x>")
    path = _write(tmp_path, "h.json", doc)
    record = str(next((ROOT / "evidence" / "h200").glob("triton--*.intoto.json")))  # one: the sweep is what is read
    board = build_leaderboard(ReportRequest(paths=(record,), out=None, sweeps=(path,), project=str(ROOT)))
    md = render_markdown(board)
    section = md[md.index("## Shape sweep"):]
    assert "<script>" not in section and "<img" not in section and "](https" not in section
    jsonschema.Draft202012Validator(SCHEMA).validate(board.to_json())


def test_the_run_s_own_verdicts_are_the_report_s():
    doc = _doc(_seed_rows(x_token=1.13), launch=[{"impl": "ours", "member": "token-is", "full_wall_ms": 0.11}])
    lines = [f"{'PASS' if t.met else 'FAIL'} {t.name}" for t in judge_run(doc)]
    assert lines[0].startswith("PASS token level") and lines[1].startswith("FAIL seed shape")
    assert lines[-1].startswith("PASS launch-bound")


def test_the_committed_sweeps_load_whole():
    """The committed page's sweeps, three H200 files and two H100 files: every floor follows from its shape, and
    each GPU is its own sweep; the newer H100 file (forty-third session) gives every H100 shape."""
    h200, h100 = load_sweeps(tuple(str(ROOT / p) for p in SWEEPS))
    assert (h200.gpu, len(h200.files), h100.gpu, len(h100.files)) == ("NVIDIA H200", 3, "NVIDIA H100 80GB HBM3", 2)
    assert {c.source for c in h100.cells} == {1}
    for sweep in (h200, h100):
        assert not sweep.set_aside and len(sweep.cells) == 300 and not any(c.impossible for c in sweep.cells)
    assert {c.source for c in h200.cells if c.vocab == 50257} == {1}  # round22's staged path for unaligned rows


def test_gpus_are_never_merged_and_each_is_judged_on_its_own_rows(tmp_path):
    """A newer file from another card used to replace this card's rows shape by shape, and the targets were judged
    over the mix: a fast H100 file could stand in for slow H200 shapes. Now each GPU is a sweep of its own."""
    h200 = _doc(_seed_rows(x_token=1.30), started="2026-12-01T00:00:00Z")  # over 1.15x: the token target missed
    h100 = _doc(_seed_rows(x_token=1.05), started="2026-12-06T00:00:00Z", gpu="NVIDIA H100 80GB HBM3")
    h100["meta"]["copy_TBps"] = 3.0  # under the H100's datasheet 3.35 TB/s: its rows are judged, none impossible
    for r in h100["rows"]:
        r["ours_ms"] *= COPY_TBPS / 3.0
        r["floor_ms"] *= COPY_TBPS / 3.0
        r["liger_ms"] *= COPY_TBPS / 3.0
    older = _doc(_seed_rows(x_token=1.20, batch=2), started="2026-11-30T00:00:00Z")
    sweeps = load_sweeps((_write(tmp_path, "h100.json", h100), _write(tmp_path, "h200.json", h200),
                          _write(tmp_path, "older.json", older)))
    assert [s.gpu for s in sweeps] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]  # the most files first
    mine, other = sweeps
    assert {(c.batch, c.member, round(c.x_floor, 2)) for c in mine.cells if c.member == "token-is"} == {
        (8, "token-is", 1.3), (2, "token-is", 1.2)}
    assert not _targets(mine)["token"].met and _targets(other)["token"].met
    record = str(next((ROOT / "evidence" / "h200").glob("triton--*.intoto.json")))
    board = build_leaderboard(ReportRequest(paths=(record,), out=None, project=str(ROOT), sweeps=(
        _write(tmp_path, "a.json", h200), _write(tmp_path, "b.json", h100))))
    page = board.to_json()
    jsonschema.Draft202012Validator(SCHEMA).validate(page)
    assert [s["gpu"] for s in page["sweeps"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]  # one file each: by name
    assert page["sweep"] == page["sweeps"][0]
    md = render_markdown(board)
    assert "## Shape sweep of implementations/triton on NVIDIA H200 " in md
    assert "## Shape sweep of implementations/triton on NVIDIA H100 80GB HBM3 " in md


def test_the_command_line(tmp_path):
    from click.testing import CliRunner

    from grpo_conform.cli import main

    record = str(next((ROOT / "evidence" / "h200").glob("triton--*.intoto.json")))
    missing = CliRunner().invoke(main, ["report", record, "--sweep", str(tmp_path / "none.json"), "--out",
                                        str(tmp_path / "page")])
    assert missing.exit_code == 2 and "none.json: no such file" in missing.output and "Traceback" not in missing.output
    rows = _seed_rows(x_token=1.30)
    rows[0]["floor_ms"] *= 2
    ok = CliRunner().invoke(main, ["report", record, "--sweep", _write(tmp_path, "s.json", _doc(rows)), "--out",
                                   str(tmp_path / "page")])
    assert ok.exit_code == 0, ok.output
    assert "shape sweep on NVIDIA H200 (unsigned benchmark output): 2 row(s) from 1 file(s); 4 of 4 target(s) met" in ok.output
    assert "sweep not shown: " in ok.output and "token-is: floor_ms" in ok.output
    page = (tmp_path / "page" / "index.html").read_text()
    assert 'id="sweep"' in page and 'data-protocol="sweep"' in page


def test_the_copy_grid_shows_what_a_plain_pass_reaches(tmp_path):
    """torch's copy_ of the same logits, against the plain floor: the masked member's own floor is lower, so a
    copy_ read against it would look slower than it is."""
    rows = _seed_rows()
    plain = rows[0]["floor_ms"]  # token-is: every row read
    for r in rows:
        r["copy_ms"] = 1.01 * plain
    sweep = load_sweep((_write(tmp_path, "c.json", _doc(rows)),))
    assert {round(c.copy_x_floor, 3) for c in sweep.cells} == {1.01}
    title, headers, body = grids(sweep)[-1]
    assert title.startswith("torch copy_ of the same logits, bfloat16") and body == [("b8 s1024", "1.010x")]


def test_a_member_timed_twice_at_one_shape_is_set_aside(tmp_path):
    """An appended fast row must not stand for the shape: neither of the two is shown or judged."""
    rows = _seed_rows(x_token=1.30) + [_row(128256, 8, "token-is", 1.01)]
    sweep = load_sweep((_write(tmp_path, "d.json", _doc(rows)),))
    assert sorted(c.member for c in sweep.cells) == ["sequence-offpolicy-mask", "token-offpolicy-mask"]
    assert [why for _, why in sweep.set_aside] == ["the file times this member 2 times at this shape"] * 2


def test_the_least_call_counts_the_misses_it_shares(tmp_path):
    """benchmarks/sweep_least.py's least full call (a loss kernel, then one pass of the member's bytes): a miss
    where the least call misses too is counted apart, one where it meets the target is ours alone; the launch
    target likewise against the least autograd call. A least call slower than ours is not the least and excuses
    nothing (an edited file's inflated least_ms). Files without least calls say nothing (None)."""
    def floor(member, vocab):
        row = SweepRow(vocab=vocab, batch=1, seq=512, dtype="bfloat16", member=member, unmasked_fraction=0.75)
        return floor_ms(row, COPY_TBPS * 1e12)

    rows = [_row(32000, 1, "token-is", 1.40, seq=512, least_ms=1.30 * floor("token-is", 32000)),
            _row(32000, 1, "token-offpolicy-mask", 1.40, seq=512,
                 least_ms=1.10 * floor("token-offpolicy-mask", 32000)),
            _row(50257, 1, "token-is", 1.05, seq=512, least_ms=1.02 * floor("token-is", 50257))]
    launch = [{"impl": "ours", "member": "token-is", "full_wall_ms": 0.2},
              {"impl": "least-autograd-call", "full_wall_ms": 0.13}]
    sweep = load_sweep((_write(tmp_path, "l.json", _doc(rows, launch=launch)),))
    t = _targets(sweep)
    # token-is at V 32000 misses and so does its least call; the masked member's least call meets the target
    assert (t["token"].passed, t["token"].misses, t["token"].least_misses) == (1, 2, 1)
    assert t["launch-bound"].least_misses == 1  # the least call itself takes 0.13 ms
    cell = next(c for c in sweep.cells if c.member == "token-is" and c.vocab == 32000)
    assert cell.least_x_floor == pytest.approx(1.30)
    record = str(next((ROOT / "evidence" / "h200").glob("triton--*.intoto.json")))  # one: the sweep is what is read
    board = build_leaderboard(ReportRequest(paths=(record,), out=None, sweeps=(str(tmp_path / "l.json"),),
                                            project=str(ROOT)))
    jsonschema.Draft202012Validator(SCHEMA).validate(board.to_json())
    page = render_markdown(board)
    assert "misses where the least call misses too" in page and "| 1 of 2 |" in page
    quick = [launch[0], dict(launch[1], full_wall_ms=0.09)]
    within = load_sweep((_write(tmp_path, "w.json", _doc(rows, launch=quick)),))
    assert _targets(within)["launch-bound"].least_misses == 0  # a least call within 0.12 ms: the miss is ours
    inflated = [dict(r, least_ms=2.0 * r["ours_ms"]) for r in rows]  # "least" slower than ours: not the least
    slow = [launch[0], dict(launch[1], full_wall_ms=0.3)]
    over = load_sweep((_write(tmp_path, "i.json", _doc(inflated, launch=slow)),))
    assert _targets(over)["token"].least_misses == 0 and _targets(over)["launch-bound"].least_misses == 0
    old = load_sweep((_write(tmp_path, "o.json", _doc([{k: v for k, v in r.items() if k != "least_ms"} for r in rows],
                                                     launch=launch[:1])),))
    assert _targets(old)["token"].least_misses is None and _targets(old)["launch-bound"].least_misses is None


def test_the_readme_rebuilds_the_leaderboard_from_every_sweep_the_build_names():
    """README's rebuild command names the sweeps REGENERATE names, in order (it once lacked the newest H100 sweep)."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("grpo-conform report evidence/h200 evidence/h100"):]
    block = block[:block.index("```")]
    assert [w for w in block.replace("\\\n", " ").split() if w.endswith(".json") and "sweep" in w] == list(SWEEPS)
