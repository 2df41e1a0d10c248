"""The leaderboard's fused linear + GRPO sections (issue 31): signed synthetic records of
grpo-fused-linear members, built with the project's record builders (build_statement, write_record,
compute_floor) and signed by a test key, reported as the committed evidence is.

What must hold: one section per member naming the operation, x floor over the binding floor
(max of DRAM and the GEMMs' FLOP floor), the GEMM ceiling ratio where a timing has one, peak extra
memory, ranking by full, and the backward-only protocol shown in its own table, never ranked and
never the headline even where it is the fastest number."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from grpo_conform.evidence import build_statement, write_record
from grpo_conform.floors import compute_floor, load_spec_ref
from grpo_conform.hardware import load_catalogue
from grpo_conform.report import fused as F
from grpo_conform.report import tables as T
from grpo_conform.report.build import ReportRequest, build_leaderboard
from grpo_conform.report.write import render
from grpo_conform.results import ImplementationResult, MemberResult, WorkloadResult
from test_evidence_support import Report, identity_of, make_project, new_key, outcome, trust_list

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 12, 3, 6, 0, tzinfo=timezone.utc)
SOFTWARE = {"python": "3.12.3", "torch": "2.11.0", "triton": "3.5.0", "grpo_conform": "0.1.0", "cuda_runtime": "13.0",
            "git_commit": None, "git_dirty": None}
H200 = load_catalogue().resolve("NVIDIA H200").gpu
MS = 1_000_000
# implementation -> protocol -> median ns at seed-b2 (token-is); liger's backward-only time is the fastest
# number of the table on purpose: it must still not be ranked nor become the headline.
TIMES = {"triton-fused": {"full": int(9.63 * MS), "forward": int(3.5 * MS), "backward": int(0.5 * MS)},
         "fused-torch": {"full": int(12.24 * MS), "forward": int(4.1 * MS), "backward": int(8.0 * MS)},
         "fused-liger": {"full": int(117.6 * MS), "forward": int(58.1 * MS), "backward": int(0.3 * MS)}}
GEMMS_NS = int(9.12 * MS)  # the run's cuBLAS time of the three GEMMs (triton-fused's record carries it)


def _timing(spec, resolved, protocol: str, median: int, gemm: bool) -> dict:
    floor = compute_floor(spec, resolved, protocol, H200)
    t = {"protocol": protocol, "event": {"median_ns": median, "p10_ns": median - 1000, "p90_ns": median + 1000},
         "host_wall": {"median_ns": median + 20_000}, "floor": floor.to_json(), "peak_bytes": 3 * 2**30 + protocol.count("f")}
    if floor.dram_ns:
        t["floor_ratio"] = median / floor.dram_ns
    if gemm and protocol == "full":  # the three GEMMs of forward + backward, each in its fastest layout
        t["gemm_ceiling_ratio"] = median / GEMMS_NS
        t["gemm_ceiling"] = {"measured": True, "median_ns": GEMMS_NS, "layout": ["rows of 2048", "rows of 2048", "whole"]}
    elif gemm and protocol == "forward":  # a record from before the layouts: a ratio, no layout
        t["gemm_ceiling_ratio"] = median / (GEMMS_NS // 3)
    return t


def _record(project: Path, out: Path, key, name: str, member: str, times: dict[str, int]) -> None:
    spec = load_spec_ref(f"grpo-fused-linear/{member}")
    resolved = spec.resolve(spec.workload("seed-b2"))
    folder = project / "implementations" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "impl.py").write_text(f"# {name}\n")
    timings = tuple(_timing(spec, resolved, p, ns, name == "triton-fused") for p, ns in times.items())
    w = WorkloadResult("seed-b2", dict(resolved.axes), dict(resolved.dtypes), "cuda", (1, 2),
                       (outcome("loss", "pass"),), timings)
    manifest = {"name": name, "language": "python", "license": "MIT", "source": None, "description": name}
    result = MemberResult(spec, "conformant", "synthetic", (w,), None)  # coverage derived: seed-b2 of the member
    impl = ImplementationResult(name, str(folder), identity_of(folder), manifest, "conformant", "synthetic", (w,),
                                {"pid": 1}, (result,))
    report = Report({"kind": "cuda", "name": "NVIDIA H200"}, False, (impl,), {spec.identity: spec},
                    "2026-12-03T05:00:00Z", "2026-12-03T05:00:05Z", SOFTWARE, {})
    old = os.getcwd()
    os.chdir(project)
    try:
        write_record(build_statement(report, impl, result), out / f"{name}--{member}.intoto.json", key)
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(records folder, trusted-keys file, project) of four signed fused-linear records."""
    project = make_project(tmp_path_factory.mktemp("proj"), impls=())
    shutil.copy(ROOT / "specs" / "grpo-fused-linear.v1.json", project / "specs")
    out = project / "records"
    out.mkdir()
    key = new_key()
    keys = trust_list(project, (key, {}))
    for name, times in TIMES.items():
        _record(project, out, key, name, "token-is", times)
    _record(project, out, key, "fused-torch", "token-offpolicy-mask-kl-ref-weight", {"full": int(25 * MS)})
    return out, keys, project


@pytest.fixture(scope="module")
def board(made):
    out, keys, project = made
    return build_leaderboard(ReportRequest(paths=(str(out),), trusted_keys=keys, project=str(project), out=None,
                                           now=NOW))


def _section(board, member: str):
    (s,) = [s for s in board.sections if s.member == member]
    return s


def test_one_section_per_member_naming_the_operation(board):
    assert not board.rejected and len(board.inputs) == 4
    assert {s.spec_id for s in board.sections} == {"grpo-fused-linear/token-is",
                                                    "grpo-fused-linear/token-offpolicy-mask-kl-ref-weight"}
    assert all(s.operation == "grpo-fused-linear" and s.current for s in board.sections)
    md = render(board, "markdown")
    # titled by the catalogue entry the device name resolves to (gpu_named.py), not the name as recorded
    assert ("## grpo-fused-linear/token-is 1.0.0 (member token-is) on NVIDIA H200 SXM: fused linear + GRPO "
            "loss \\(lm\\_head GEMM and loss in one operation\\)") in md
    assert "x floor (max DRAM, FLOP) | x GEMM ceiling |" in md and "peak extra memory" in md
    assert "fused linear + GRPO loss" in render(board, "html")


def test_ranked_by_full_with_the_binding_floor_and_the_gemm_ceiling(board):
    s = _section(board, "token-is")
    full = {r.implementation: r for r in s.rows if r.protocol == "full"}
    assert [full[n].rank for n in ("triton-fused", "fused-torch", "fused-liger")] == [1, 2, 3]
    assert full["fused-liger"].vs_first == pytest.approx(117.6 / 9.63, rel=1e-4)
    floor = compute_floor(load_spec_ref("grpo-fused-linear/token-is"),
                          load_spec_ref("grpo-fused-linear/token-is").resolve(
                              load_spec_ref("grpo-fused-linear/token-is").workload("seed-b2")), "full", H200)
    assert floor.binding == "arithmetic" and floor.arithmetic_ns > floor.dram_ns  # the GEMMs bind at this shape
    r = full["triton-fused"]
    assert r.floor_binding == "arithmetic" and r.binding_floor_ratio == pytest.approx(9.63e6 / floor.floor_ns, rel=1e-5)
    assert r.gemm_ceiling_ratio == pytest.approx(9.63 / 9.12, rel=1e-5) and full["fused-torch"].gemm_ceiling_ratio is None
    (cells,) = [c for c in F.timing_rows(s, "full") if c[2] == "triton-fused"]
    assert cells[5] == f"{9.63e6 / floor.floor_ns:.2f}x (arithmetic binds)" and cells[6] == "1.06x (2048 / 2048 / whole)"
    (fwd,) = [c for c in F.timing_rows(s, "forward") if c[2] == "triton-fused"]
    assert fwd[6] == f"{3.5 / (9.12 / 3):.2f}x"  # no layout recorded: no brackets
    assert cells[8] == "3.00 GiB"
    assert [c[6] for c in F.timing_rows(s, "full") if c[2] == "fused-torch"] == ["—"]


def test_backward_only_is_shown_as_what_it_is_and_never_ranked(board):
    s = _section(board, "token-is")
    back = [r for r in s.rows if r.protocol == "backward"]
    assert len(back) == 3 and all(r.rank is None and r.vs_first is None for r in back)
    assert min(back, key=lambda r: r.median_ms).implementation == "fused-liger"  # fastest there, still unranked
    assert T.first_by_protocol(s, "backward") is None and T.first_by_protocol(s, "full").implementation == "triton-fused"
    title = F.protocol_title(s, "backward")
    assert "y.backward(retain_graph=True) timed after one untimed forward" in title and "never ranked" in title
    assert "headline" in F.protocol_title(s, "full")
    assert all(c[1] == "—" and c[5] == "—" and c[7] == "—" for c in F.timing_rows(s, "backward"))
    html = render(board, "html")
    assert "#1 at batch 2 (full): triton-fused" in html and "#1 at batch 2 (backward)" not in html
    md = render(board, "markdown")
    assert md.index("### full: forward + backward") < md.index("### backward-only: the seed benchmark")


def test_a_logits_section_keeps_its_columns(board):
    s = _section(board, "token-is")
    logits = type(s)(**{**s.__dict__, "operation": "grpo-logits"})
    assert F.timing_headers(logits) == T.TIMING_HEADERS and F.heading_suffix(logits) == ""
    assert F.timing_rows(logits, "full") == T.timing_rows(logits, "full")
    assert F.protocol_title(logits, "backward") == T.PROTOCOL_TITLES["backward"]


def test_each_reported_row_names_the_spec_it_was_audited_against(tmp_path):
    from grpo_conform.report.reported import audit_reported

    seed = ROOT / "tests" / "data" / "seed-records.csv"
    header, fused_row = seed.read_text().splitlines()[:2]
    logits_row = fused_row.replace("fused_linear_grpo_loss", "grpo_loss_kernel_no_kl").replace(
        '""H"": 4096, ', "")  # the same row, as Liger's logits-level kernel (no hidden size)
    path = tmp_path / "rows.csv"
    path.write_text("\n".join([header, logits_row, fused_row]) + "\n")
    logits, fused = audit_reported((str(path),), "grpo-token-is")
    assert logits.audited_against == "grpo/token-is" and fused.audited_against == "grpo-fused-linear/token-is"
    assert "give Liger's CSV with --against" in fused.explanation  # without --against: the level is unknown
    (against,) = [r for r in audit_reported((str(path),), against=str(ROOT / "tests" / "data" /
                                                                     "liger-fused-linear-grpo.csv"))
                  if r.operation.startswith("fused")]
    assert "--against" not in against.explanation and against.audited_against == "grpo-fused-linear/token-is"
    assert [c[7] for c in T.reported_rows((logits, fused))] == ["grpo/token-is", "grpo-fused-linear/token-is"]


def test_the_report_command_forwards_against_to_the_audit(made, tmp_path):
    import json

    from click.testing import CliRunner

    from grpo_conform.cli import main

    out, keys, project = made
    seed = ROOT / "tests" / "data" / "seed-records.csv"
    args = ["report", str(out), "--trusted-keys", keys, "--project", str(project), "--reported", str(seed),
            "--out", str(tmp_path / "page"), "--format", "json"]
    plain = json.loads(CliRunner().invoke(main, args, catch_exceptions=False).output)
    run = CliRunner().invoke(main, args + ["--against", str(ROOT / "tests" / "data" / "liger-fused-linear-grpo.csv")],
                             catch_exceptions=False)
    doc = json.loads(run.output)
    assert {r["audited_against"] for r in doc["reported"]["records"]} == {"grpo-fused-linear/token-is"}
    gspo = [r for r in doc["reported"]["records"] if "sequence-level (GSPO) row" in r["explanation"]]
    assert len(gspo) == 4 and not any("sequence-level (GSPO) row" in r["explanation"]
                                      for r in plain["reported"]["records"])
    assert {s["operation"] for s in doc["sections"]} == {"grpo-fused-linear"}
    import jsonschema

    schema = json.loads((ROOT / "grpo_conform" / "schemas" / "leaderboard.v1.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)  # the new fields are declared


def test_the_scaling_plot_draws_the_binding_floor(board):
    from grpo_conform.report.plot import scaling_svg

    s = _section(board, "token-is")
    b4 = [type(r)(**{**r.__dict__, "batch": 4, "workload": "seed-b4", "median_ms": 2 * r.median_ms}) for r in s.rows]
    svg = scaling_svg(type(s)(**{**s.__dict__, "rows": s.rows + tuple(b4)}), "full")
    assert svg and "max(DRAM, FLOP)" in svg and "measured ceilings" not in svg
