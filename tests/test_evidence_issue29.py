"""Issue 29's attacks on the leaderboard, the trust root, project discovery and the rendered pages.

Leaderboard tests give `build_sections` records as if verified (the signature is never what stops
these attacks: a trusted key signed them); the rest go through `verify` or `report` with a
throw-away project and trust root.
"""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_conform.evidence import TrustedKeysError, load_trust_root
from grpo_conform.evidence import trust as trust_module
from grpo_conform.evidence.identities import project_root_for
from grpo_conform.evidence.partial import checks_narrowed, partial_reason
from grpo_conform.report.build import Leaderboard
from grpo_conform.report.write import render
from grpo_conform.evidence.semantics import future_problem
from grpo_conform.report.load import RejectedRecord, VerifiedRecord
from grpo_conform.report.model import build_sections
from test_evidence_support import NOW, identity_of, make_project, make_trust_root, new_key, signed_record, \
    statement_for, verify

SPEC_ID = "grpo-token-is"


def _timing(protocol: str, median_ns: int, floor_ns: int = 1_000_000) -> dict:
    return {"protocol": protocol, "event": {"median_ns": median_ns, "p10_ns": median_ns, "p90_ns": median_ns},
            "floor": {"floor_ns": floor_ns, "measured_ns": floor_ns, "method": "traffic-v1"}}


def _record(project, name: str, finished: str, timed: dict[str, int], *, path: str | None = None,
            spec_identity: str | None = None, verdict: str = "conformant", untimed: tuple[str, ...] = (),
            floor_ns: int = 1_000_000) -> VerifiedRecord:
    path = path or f"implementations/{name}"
    folder = project / path
    identity = identity_of(folder) if folder.is_dir() else "e" * 64
    workloads = [{"workload": w, "axes": {"batch": int(w.split("-b")[-1])}, "timings": [_timing("full", ns, floor_ns)],
                  "checks": []} for w, ns in timed.items()]
    workloads += [{"workload": w, "axes": {}, "timings": [], "checks": []} for w in untimed]
    pred = {"spec": {"id": SPEC_ID, "version": "1.0.0", "identity": spec_identity or _current(project)},
            "implementation": {"name": name, "path": path, "identity": identity}, "verdict": verdict,
            "result": "PASSED" if verdict == "conformant" else "FAILED", "failedTests": [],
            "run": {"finished": finished}, "hardware": {"catalogue": {"name": "NVIDIA H200 SXM"}},
            "coverage": {"complete": True, "checked": 1, "total": 1}, "workloads": workloads}
    return VerifiedRecord(f"{name}-{finished}.intoto.json", "r" * 64, {"predicate": pred}, {"keyid": "k"})


def _current(project) -> str:
    from grpo_conform.spec import find_spec

    return find_spec(SPEC_ID, dirs=[project / "specs"]).identity


@pytest.fixture()
def project(tmp_path):
    return make_project(tmp_path / "proj", ("triton", "liger"))


def _ranks(section, workload="seed-b16", protocol="full") -> dict[str, int | None]:
    return {r.implementation: r.rank for r in section.rows if r.workload == workload and r.protocol == protocol}


def test_a_newer_record_without_timings_does_not_hide_the_timed_one(project) -> None:
    """The committed page showed Liger #1 at batch 16: triton's newest record (long-completion, no
    timings) replaced its timed one."""
    recs = [_record(project, "triton", "2026-12-02T11:41:42Z", {"seed-b16": 2_253_000}),
            _record(project, "triton", "2026-12-02T11:57:40Z", {}, untimed=("long-completion",)),
            _record(project, "liger", "2026-12-02T11:46:05Z", {"seed-b16": 3_117_000})]
    (section,) = build_sections(recs, str(project))
    assert _ranks(section) == {"triton": 1, "liger": 2}


def test_superseded_spec_identities_are_history_of_one_member_section(project) -> None:
    recs = [_record(project, "triton", "2026-12-02T11:41:42Z", {"seed-b16": 2_253_000}),
            _record(project, "liger", "2026-11-30T11:24:12Z", {"seed-b16": 1_000_000}, spec_identity="a" * 64)]
    (section,) = build_sections(recs, str(project))
    assert section.current and section.spec_identity == _current(project)
    assert _ranks(section) == {"triton": 1}  # the old identity's faster time is not ranked against it
    (old,) = section.history
    assert not old.current and old.spec_identity == "a" * 64 and _ranks(old) == {"liger": 1}


def test_a_second_folder_claiming_a_name_is_shown_apart_and_flagged(project) -> None:
    squat = project / "implementations" / "contrib"
    shutil.copytree(project / "implementations" / "liger", squat)
    (squat / "impl.py").write_text("# squatter\n")
    recs = [_record(project, "triton", "2026-12-02T11:41:42Z", {"seed-b16": 2_253_000}),
            _record(project, "triton", "2026-12-02T12:00:00Z", {"seed-b16": 1_100_000}, path="implementations/contrib")]
    (section,) = build_sections(recs, str(project))
    labels = {i.label: i for i in section.implementations}
    assert set(labels) == {"triton (implementations/triton)", "triton (implementations/contrib)"}
    assert all(any("claimed by 2 folders" in f for f in i.flags) for i in labels.values())
    assert "triton" not in _ranks(section)  # no row under the bare name the squatter claimed


def test_records_of_an_identity_not_in_the_tree_fill_no_current_cell(project) -> None:
    recs = [_record(project, "triton", "2026-12-02T11:41:42Z", {"seed-b16": 2_253_000}),
            _record(project, "ghost", "2026-12-02T11:41:42Z", {"seed-b16": 1_000_000})]
    (section,) = build_sections(recs, str(project))
    assert _ranks(section) == {"triton": 1}
    ghost = next(i for i in section.implementations if i.name == "ghost")
    assert any("not in this checkout's tree" in f for f in ghost.flags)


def test_a_time_below_the_records_own_floor_is_flagged_impossible_and_never_ranked(project) -> None:
    recs = [_record(project, "triton", "2026-12-02T11:41:42Z", {"seed-b16": 2_253_000}, floor_ns=2_000_000),
            _record(project, "liger", "2026-12-02T11:41:42Z", {"seed-b16": 40_000}, floor_ns=2_000_000)]
    (section,) = build_sections(recs, str(project))
    assert _ranks(section) == {"triton": 1, "liger": None}
    assert next(r for r in section.rows if r.implementation == "liger").flag.startswith("impossible")


def test_partial_records_and_narrowed_checks() -> None:
    assert partial_reason({"coverage": {"complete": True}}) is None
    assert partial_reason({}) is None  # v1 records say nothing: not partial
    assert "3 of 14" in partial_reason({"coverage": {"complete": False, "checked": 3, "total": 14}})
    assert partial_reason({"coverage": {"complete": True}, "selection": {"partial": True}})
    assert checks_narrowed({"coverage": {"checks_selected": ["loss"]}}) == "checks loss only"
    assert checks_narrowed({"coverage": {"checks_selected": []}, "selection": {"checks": ["loss"]}})
    assert checks_narrowed({"coverage": {"checks_selected": []}}) is None


def test_a_record_from_the_future_is_refused(project, tmp_path) -> None:
    from grpo_conform.report.build import ReportRequest, build_leaderboard
    from test_evidence_support import trust_list

    key = new_key()
    keys = trust_list(tmp_path, (key, {}))
    st = statement_for(project, "triton")
    st["predicate"]["run"]["finished"] = "2099-01-01T00:00:00Z"
    path = signed_record(project / "evidence" / "future.intoto.json", st, key)
    board = build_leaderboard(ReportRequest((path,), out=None, trusted_keys=keys, project=str(project), now=NOW))
    assert not board.inputs and board.rejected[0].reason.startswith("semantics: run.finished 2099")
    assert future_problem({"predicate": {"run": {"finished": "2026-12-01T00:00:00Z"}}}, NOW) is None
    assert verify(path, make_trust_root(tmp_path / "trust", (key, {}))).files[0].step("semantics").status == "fail"


HOSTILE = '![x](https://evil.example/p.png) <img src=x onerror=alert(1)> [link](http://evil) `code` | cell'


def test_markdown_and_html_escape_everything_from_a_record(project) -> None:
    rec = _record(project, "triton", "2026-12-02T11:41:42Z", {"seed-b16": 2_253_000})
    rec.predicate["implementation"]["license"] = HOSTILE
    board = Leaderboard(tuple(build_sections([rec], str(project))), (), (RejectedRecord("x.json", HOSTILE),),
                        (rec,), "keys", SPEC_ID)
    md = render(board, "markdown")
    for needle in ("](", "<img", "![", "`code`", "http://evil"):
        assert needle not in md, needle
    html = render(board, "html")
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_identities_come_from_the_verifiers_checkout_never_from_next_to_the_record(project, tmp_path,
                                                                                  monkeypatch) -> None:
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    path = signed_record(project / "evidence" / "r.intoto.json", statement_for(project, "triton"), key)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert project_root_for(project / "evidence" / "r.intoto.json", None) != project.resolve()
    f = verify(path, trust, project=None).files[0]  # a pyproject.toml beside the record decides nothing
    assert f.step("identities").status in ("unverified", "fail"), f.step("identities")
    assert verify(path, trust, project=str(project)).files[0].ok  # --project names it


def test_a_gap_in_the_root_chain_is_an_error(tmp_path) -> None:
    fx = make_trust_root(tmp_path / "trust", (new_key(), {}))
    shutil.copy(fx.folder / "1.root.json", fx.folder / "3.root.json")  # version 2 deleted
    with pytest.raises(TrustedKeysError, match="root version 2 is missing"):
        load_trust_root(fx.folder, pinned=fx.pinned, now=NOW)


def test_a_rolled_back_targets_is_refused_below_the_compiled_minimum(tmp_path) -> None:
    fx = make_trust_root(tmp_path / "trust", (new_key(), {}))  # targets version 1
    assert load_trust_root(fx.folder, pinned=fx.pinned, now=NOW, minimum=(1, 1)).keys
    with pytest.raises(TrustedKeysError, match="targets version 1 is older than version 2"):
        load_trust_root(fx.folder, pinned=fx.pinned, now=NOW, minimum=(1, 2))
    with pytest.raises(TrustedKeysError, match="root version 1 is older than version 2"):
        load_trust_root(fx.folder, pinned=fx.pinned, now=NOW, minimum=(2, 1))
    # the shipped root is at the compiled minimum, so restoring any older file fails
    shipped = trust_module.shipped_trust_dir()
    assert json.loads((shipped / "targets.json").read_text())["signed"]["version"] == trust_module.MIN_TARGETS_VERSION
    assert max(trust_module._root_files(shipped)) == trust_module.MIN_ROOT_VERSION


def test_a_trust_root_that_differs_from_the_release_is_refused_saying_what_differs(monkeypatch) -> None:
    assert load_trust_root().source.startswith("shipped trust root")
    monkeypatch.setitem(trust_module.RELEASE_TRUST_FILES, "targets.json", "0" * 64)
    with pytest.raises(TrustedKeysError, match=r"differs from the one this release ships \(targets.json sha256 "):
        load_trust_root()
    folder = trust_module.shipped_trust_dir()  # named deliberately, it is an override and says so
    assert load_trust_root(folder).source.startswith("override --trust-root ")


def test_merge_verifies_every_record_and_refuses_mixed_software(project, tmp_path) -> None:
    from grpo_conform.gate.merge import MergeError, MergeRequest, run_merge
    from test_evidence_support import trust_list

    key = new_key()
    keys = trust_list(tmp_path, (key, {}))
    ev = project / "evidence"
    good = signed_record(ev / "good.intoto.json", statement_for(project, "triton"), key)
    unsigned = signed_record(ev / "unsigned.intoto.json", statement_for(project, "liger"), None)
    forged = statement_for(project, "liger")
    forged["predicate"]["implementation"]["identity"] = "0" * 64  # names a tree nobody has
    bad = signed_record(ev / "bad.intoto.json", forged, key)
    req = dict(trusted_keys=keys, project=str(project))
    assert run_merge(MergeRequest((good,), **req)).exit_code == 0
    with pytest.raises(MergeError, match="unsigned.intoto.json: does not verify"):
        run_merge(MergeRequest((good, unsigned), **req))
    with pytest.raises(MergeError, match="bad.intoto.json: does not verify"):
        run_merge(MergeRequest((good, bad), **req))
    with pytest.raises(MergeError, match="does not verify"):  # the shipped root does not trust a test key
        run_merge(MergeRequest((good,), project=str(project)))
    other = statement_for(project, "liger")
    other["predicate"]["software"]["torch"] = "2.1.0"
    mixed = signed_record(ev / "mixed.intoto.json", other, key)
    with pytest.raises(MergeError, match="different torch"):
        run_merge(MergeRequest((good, mixed), **req))


def test_verify_judges_a_record_against_the_spec_the_verifier_resolves(project, tmp_path) -> None:
    from grpo_conform.evidence.spec_semantics import spec_problems
    from test_evidence_support import outcome

    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    lying = statement_for(project, "triton", outcomes=(outcome("loss", "pass", mismatches=3),))
    path = signed_record(project / "evidence" / "lying.intoto.json", lying, key)
    f = verify(path, trust).files[0]
    assert f.step("semantics").status == "fail" and "marked pass but its evidence finds mismatches=3" in \
        f.step("semantics").message
    st = statement_for(project, "triton")
    assert spec_problems(st, project) == []
    said = copy_of(st)
    said["predicate"]["workloads"][0]["checks"][0]["message"] = "call A#1: 3/75045 elements outside tolerance"
    assert any("message reports elements outside tolerance" in p for p in spec_problems(said, project))
    made_up = copy_of(st)
    made_up["predicate"]["workloads"][0]["workload"] = "made-up"
    assert any("not workloads of" in p for p in spec_problems(made_up, project))
    full = copy_of(st)
    full["predicate"]["coverage"].update(workloads_not_run=[], total=1, checked=1, complete=True)
    assert any("coverage must account" in p for p in spec_problems(full, project))
    fast = copy_of(st)
    fast["predicate"]["workloads"][0]["timings"] = [_timing("full", 20_000, floor_ns=1_000_000)]
    assert any("impossible" in p for p in spec_problems(fast, project))
    relabel = copy_of(st)
    relabel["predicate"]["spec"].update(id="grpo/token-is", member="dapo-mask")
    assert any("relabelled" in p for p in spec_problems(relabel, project))
    extra = copy_of(st)
    extra["predicate"]["coverage"]["exercised"] = {"cases": []}  # another helper's key: allowed
    assert spec_problems(extra, project) == []


def copy_of(statement: dict) -> dict:
    return json.loads(json.dumps(statement))


def test_a_timing_below_the_specs_floor_is_refused_even_when_the_record_lowers_its_own_floor() -> None:
    """The audit's record: triton at 0.02x the DRAM floor, its own floor edited to 0 (a record of the
    current member identity: the strict floor is recomputed from the spec the verifier resolves)."""
    import base64

    from grpo_conform.evidence.spec_semantics import spec_problems
    from grpo_conform.evidence.statement import PROJECT_ROOT

    (path,) = (PROJECT_ROOT / "evidence" / "h200").glob("triton--token-is--nvidia-h200--20261202T224410Z*")
    st = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))
    assert spec_problems(st, PROJECT_ROOT) == []  # the real record is possible
    for w in st["predicate"]["workloads"]:
        for t in w.get("timings", []):
            t["event"]["median_ns"] = t["event"]["median_ns"] // 50
            t["floor"]["floor_ns"] = t["floor"]["measured_ns"] = 0
            t["below_floor"] = False
    problems = spec_problems(st, PROJECT_ROOT)
    assert any(p.startswith("seed-b16 full: median") and "below the strict floor" in p for p in problems), problems


def test_merge_refuses_a_json_report_whose_identity_is_not_the_checkouts(project, tmp_path, monkeypatch) -> None:
    from grpo_conform.gate.merge import MergeError, MergeRequest, run_merge

    folder = project / "implementations" / "triton"
    monkeypatch.chdir(project)

    def report(identity: str) -> str:
        doc = {"tool": "grpo-conform", "device": {"kind": "cpu", "name": "x86_64"}, "implementations": [
            {"name": "triton", "path": str(folder), "identity": {"sha256": identity}, "status": "conformant",
             "message": "ok", "members": [{"spec": {"id": SPEC_ID, "identity": {"sha256": _current(project)}},
                                           "status": "conformant", "message": "ok", "workloads": [],
                                           "coverage": {}}]}]}
        path = tmp_path / f"{identity[:4]}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    assert run_merge(MergeRequest((report(identity_of(folder)),))).implementations
    with pytest.raises(MergeError, match="the report was edited or ran another tree"):
        run_merge(MergeRequest((report("f" * 64),)))


def test_a_spec_file_under_a_shipped_id_is_not_that_spec(project, tmp_path) -> None:
    """Adversarial round 2026-12-05: a copy of the shipped spec with its tolerances loosened 1000x, kept
    elsewhere in the project under the same id and version, verified as that spec (and passed
    `--spec grpo-token-is --spec-version ...`). The id@version a project's specs/ ships names that file."""
    import hashlib

    import rfc8785

    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    shipped = project / "specs" / "grpo-token-is.v1.json"
    doc = json.loads(shipped.read_text())
    doc["title"] = doc.get("title", "") + " (loosened)"  # any change: the content is no longer the shipped spec
    alt = project / "specs-alt" / shipped.name
    alt.parent.mkdir()
    alt.write_text(json.dumps(doc))
    st = statement_for(project, "triton")
    descriptor = next(d for d in st["predicate"]["configuration"] if d["name"].startswith("spec:"))
    canonical = hashlib.sha256(rfc8785.dumps(doc)).hexdigest()
    file_sha = hashlib.sha256(alt.read_bytes()).hexdigest()
    descriptor.update(uri="specs-alt/grpo-token-is.v1.json", digest={"rfc8785Sha256": canonical, "sha256": file_sha})
    st["predicate"]["spec"].update(identity=canonical, file_sha256=file_sha)
    f = verify(signed_record(project / "evidence" / "alt.intoto.json", st, key), trust).files[0]
    step = f.step("identities")
    assert step.status == "fail" and "which this project ships as specs/grpo-token-is.v1.json" in " ".join(
        (step.message, *step.notes)), step
    assert verify(signed_record(project / "evidence" / "ok.intoto.json", statement_for(project, "triton"), key),
                  trust).files[0].ok  # the shipped file itself
