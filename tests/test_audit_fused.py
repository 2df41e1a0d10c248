"""Audit of Liger's fused lm_head + GRPO rows (issue 31, item 7): judged as the fused-linear operation
with the backward-only protocol's accumulation floor, the token/sequence row of Liger's own CSV, and
the reproduction from our records (synthetic unsigned ones, built with the project's record builders)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from grpo_conform.audit import AuditRequest, run_audit
from grpo_conform.audit_against import decimals, written_equal
from grpo_conform.audit_fused import ACCUMULATION, PROTOCOL_TEXT
from grpo_conform.evidence import build_statement, write_record
from grpo_conform.floors import load_spec_ref
from grpo_conform.results import ImplementationResult, MemberResult, WorkloadResult
from test_evidence_support import Report, identity_of, make_project, outcome

DATA = Path(__file__).resolve().parent / "data"
SEED = DATA / "seed-records.csv"
LIGER = DATA / "liger-fused-linear-grpo.csv"  # Liger's own rows, with LIGER.source.json
HEADER = SEED.read_text().splitlines()[0]
CONFIG = '"{""T"": 1024, ""H"": 4096, ""V"": 128256, ""dtype"": ""torch.bfloat16""}"'
A100 = "NVIDIA A100-SXM4-80GB"
WEIGHT_BYTES = 128256 * 4096 * 2
SOFTWARE = {"python": "3.12.3", "torch": "2.11.0", "triton": None, "grpo_conform": "0.1.0", "cuda_runtime": "13.0",
            "git_commit": None, "git_dirty": None}


def _audit(path, **kw):
    kw.setdefault("records", ())
    return run_audit(AuditRequest(str(path), **kw))


def _csv(tmp_path, *rows: str, name: str = "rows.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def _row(name: str, provider: str, mode: str, batch: int, ms: float, config: str = CONFIG) -> str:
    return f"{name},{provider},{mode},speed,ms,B,batch size,{batch},{ms},,,{config},{A100},2025-08-05,0.6.1"


@pytest.fixture(scope="module")
def seed():
    return _audit(SEED)


# -- 1. the operation and protocol the rows timed -----------------------------------------------------
def test_seed_rows_are_judged_as_the_fused_linear_backward_only_protocol(seed):
    assert len(seed.audits) == 10 and seed.fused_spec.id == "grpo-fused-linear/token-is"
    for a in seed.audits:
        assert a.spec_id == "grpo-fused-linear/token-is"
        assert a.record.axes == {"batch": a.record.axes["batch"], "seq": 1024, "hidden": 4096, "vocab": 128256}
        assert a.workload == f"seed-b{a.record.axes['batch']}"
        assert "fused-linear operation" in a.summary and PROTOCOL_TEXT in a.summary
        assert "never a headline time of the loss" in a.summary
        assert a.floor.method == ACCUMULATION and a.floor.protocol == "backward"
        assert a.floor.bytes_total == 3 * WEIGHT_BYTES  # weight.grad += stored d weight
        assert a.verdict == "plausible" and not a.comparable  # backward-only: never comparable
        assert "logits never exist" not in " ".join(f.message for f in a.findings)
    liger = [a for a in seed.audits if a.record.implementation == "liger"]
    assert all("the gradients were computed in the forward; this times the accumulation into weight.grad"
               in a.summary for a in liger)
    b2 = liger[0]
    assert b2.floor.floor_ns == 1_545_600 or abs(b2.floor.floor_ns - 1.5456e6) < 2e3  # 3.15 GB at 2,039 GB/s
    assert 1.15 < b2.floor_ratio < 1.2
    torch_rows = [a for a in seed.audits if a.record.implementation == "torch"]
    assert all("torch eager computes its gradients in this backward" in a.summary for a in torch_rows)
    assert seed.exit_code == 0 and seed.counts["impossible"] == 0


def test_logits_level_rows_are_not_relabelled_fused(tmp_path):
    logits = "\"{\"\"T\"\": 1024, \"\"V\"\": 128256, \"\"dtype\"\": \"\"torch.bfloat16\"\"}\""
    path = _csv(tmp_path, _row("grpo_loss_kernel_no_kl", "liger", "full", 2, 0.9, logits),
                _row("fused_linear_grpo_loss_token", "liger", "backward", 2, 1.81))
    report = _audit(path)
    kernel, fused = report.audits
    assert kernel.spec_id is None and not kernel.summary and kernel.floor.method == "traffic-v1"
    assert kernel.finding("operation").status == "ok" and "grpo/token-is" in kernel.finding("operation").message
    assert fused.spec_id == "grpo-fused-linear/token-is" and fused.floor.method == ACCUMULATION
    assert fused.finding("operation").status == "ok"  # the name states token level
    # a file of logits-level rows only: no fused spec in the report at all
    only = _audit(_csv(tmp_path, _row("grpo_loss_kernel_no_kl", "liger", "full", 2, 0.9, logits), name="k.csv"))
    assert only.fused_spec is None and only.audits[0].spec_id is None


def test_a_backward_only_time_below_the_accumulation_floor_is_impossible(tmp_path):
    (a,) = _audit(_csv(tmp_path, _row("fused_linear_grpo_loss_token", "liger", "backward", 2, 1.2))).audits
    assert a.verdict == "impossible" and a.finding("physics").status == "impossible"
    assert "1.55 ms" in a.finding("physics").message


def test_forward_and_full_rows_take_the_fused_floor_max_of_dram_and_flops():
    report = _audit(LIGER)
    full = next(a for a in report.audits if a.record.operation == "fused_linear_grpo_loss_token"
                and a.record.implementation == "liger" and a.record.protocol == "full" and a.record.axes["batch"] == 2)
    assert full.floor.method == "traffic-v1" and full.floor.binding == "arithmetic"  # 3 GEMMs at 312 TFLOP/s
    assert full.floor.floor_ns == pytest.approx(20.69e6, rel=1e-3)
    assert full.floor_ratio == pytest.approx(42.67 / 20.69, rel=1e-3) and full.comparable
    assert "under the full protocol" in full.summary and "headline" not in full.summary
    fwd = next(a for a in report.audits if a.record.protocol == "forward" and a.record.axes["batch"] == 2)
    # token-is's loss value reads no log-probs (the ratio is exactly 1): its forward has no GEMM to floor
    # it, so a forward row gets no ratio (ops/fused_linear/operation.py, value_reads_logprobs)
    assert fwd.floor.protocol == "forward" and fwd.floor.floor_ns == 0 and fwd.floor_ratio is None
    assert not fwd.floor.arithmetic_ns and fwd.comparable
    assert len(report.ignored) == 16  # the memory rows


def test_the_strict_bound_of_a_fused_row_counts_its_gemms_at_the_narrowest_rate():
    """Adversarial round 2026-12-05: a fused record's strict bound was its DRAM bytes' alone (0.49 ms at
    H200 b16), so 0.6 ms for three GEMMs that need 52 ms at the BF16 peak was signed and ranked #1."""
    from grpo_conform.floors import NARROWEST_SPEEDUP, below_floor

    report = _audit(LIGER)
    full = next(a for a in report.audits if a.record.operation == "fused_linear_grpo_loss_token"
                and a.record.implementation == "liger" and a.record.protocol == "full" and a.record.axes["batch"] == 2)
    floor = full.floor  # 3 GEMMs at 312 TFLOP/s: 20.69 ms; strict at twice that rate
    assert floor.strict_ns == pytest.approx(floor.arithmetic_ns / NARROWEST_SPEEDUP, abs=2)
    assert floor.strict_ns > floor.dram_ns
    assert below_floor(floor.strict_ns - 1, floor) and not below_floor(floor.strict_ns, floor)
    assert any("strict bound" in line and "FP8/INT8" in line for line in floor.derivation)


# -- 2. token- or sequence-level: which of Liger's rows a number is ------------------------------------
def test_seed_values_are_matched_to_liger_rows():
    report = _audit(SEED, against=str(LIGER))
    source = {(a.record.implementation, a.record.median_ms): a.finding("source-row") for a in report.audits}
    commit = "ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c"
    for ms in (41.5, 81.2, 160.8):  # KernelIndex's PyTorch rows: the GSPO ones
        f = source[("torch", ms)]
        assert f.status == "mismatch" and f"matches the sequence-level (GSPO) row of Liger's CSV at {commit}" \
            in f.message
    assert source[("liger", 1.81)].status == "ok" and "token-level row" in source[("liger", 1.81)].message
    assert source[("liger", 1.82)].status == "mismatch"  # the second batch-2 row is the GSPO one
    assert source[("liger", 1.97)].status == "ok"
    assert source[("liger", 1.85)].status == "warning" and "both" in source[("liger", 1.85)].message
    assert source[("torch", 22.0)].status == "warning"  # 22.01 and 22.03 both read 22.0
    gspo = [a for a in report.audits if a.finding("source-row").status == "mismatch"]
    assert len(gspo) == 4 and not any(a.comparable for a in gspo)


def test_without_the_csv_no_row_is_called_sequence_level(seed):
    for a in seed.audits:
        f = a.finding("source-row")
        assert f.status == "unknown" and "--against" in f.message and "matches the sequence-level" not in f.message


def test_a_row_that_states_its_level_is_taken_at_its_word(tmp_path):
    seq = CONFIG.replace('""dtype""', '""importance_sampling_level"": ""sequence"", ""dtype""')
    tok = CONFIG.replace('""dtype""', '""importance_sampling_level"": ""token"", ""dtype""')
    path = _csv(tmp_path, _row("fused_linear_grpo_loss", "torch", "backward", 4, 41.5, seq),
                _row("fused_linear_grpo_loss", "torch", "backward", 4, 41.5, tok),
                _row("fused_linear_grpo_loss", "torch", "backward", 4, 50.0))
    stated_seq, stated_tok, unknown = _audit(path, against=str(LIGER)).audits
    assert stated_seq.finding("source-row").status == "mismatch" and "stated by its config" in \
        stated_seq.finding("source-row").message
    assert stated_seq.finding("operation").status == "mismatch" and "GSPO" in stated_seq.finding("operation").message
    assert stated_tok.finding("source-row").status == "ok"  # its config says token: not relabelled by value
    assert unknown.finding("source-row").status == "warning" and "matches no row" in \
        unknown.finding("source-row").message


def test_written_precision():
    assert decimals(41.5) == 1 and decimals(22.0) == 1 and decimals(1.97) == 2 and decimals(160.8) == 1
    assert written_equal(41.5, 41.54521560668945) and not written_equal(41.5, 41.83603096008301)
    assert written_equal(1.97, 1.9722239971160889) and not written_equal(1.97, 1.9752960205078125)


# -- 3. the reproduction from our records --------------------------------------------------------------
def _record(project: Path, out: Path, name: str, timings: dict[str, int], workload: str = "seed-b2",
            gpu: str = "NVIDIA H200", spec_ref: str = "grpo-fused-linear/token-is", description: str = "") -> None:
    """An unsigned fused-linear record built with the project's record builder (build_statement)."""
    spec = load_spec_ref(spec_ref)
    resolved = spec.resolve(spec.workload(workload))
    folder = project / "implementations" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "impl.py").write_text(f"# {name}\n")
    w = WorkloadResult(workload, dict(resolved.axes), dict(resolved.dtypes), "cuda", (1, 2), (outcome("loss", "pass"),),
                       tuple({"protocol": p, "event": {"median_ns": ns}} for p, ns in timings.items()))
    manifest = {"name": name, "language": "python", "license": "MIT", "source": None, "description": description or name}
    member = MemberResult(spec, "conformant", "synthetic", (w,))
    impl = ImplementationResult(name, str(folder), identity_of(folder), manifest, "conformant", "synthetic",
                                (w,), {"pid": 1}, (member,))
    report = Report({"kind": "cuda", "name": gpu}, False, (impl,), {spec.identity: spec}, "2026-12-03T04:00:00Z",
                    "2026-12-03T04:00:05Z", SOFTWARE, {})
    old = os.getcwd()
    os.chdir(project)
    try:
        write_record(build_statement(report, impl, member), out / f"{name}--{gpu[-4:]}.intoto.json", None)
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("proj"), impls=())
    shutil.copy(Path(__file__).resolve().parent.parent / "specs" / "grpo-fused-linear.v1.json", project / "specs")
    out = project / "records"
    out.mkdir()
    _record(project, out, "fused-liger", {"forward": 58_100_000, "backward": 770_000, "full": 117_600_000})
    _record(project, out, "fused-torch", {"forward": 4_100_000, "full": 12_240_000}, gpu="NVIDIA A100-SXM4-80GB")
    # a logits-level record whose text names the fused family: the candidates' byte search finds it
    _record(project, out, "fused-lookalike", {"full": 1_000_000}, spec_ref="grpo-token-is",
            description="not grpo-fused-linear, only its name")
    return out


def test_a_record_of_another_spec_that_names_the_fused_family_is_not_a_measurement(records):
    from grpo_conform.audit_repro import _candidate, load_measurements

    lookalike = next(records.glob("fused-lookalike--*"))
    assert _candidate(lookalike)  # found by the cheap look, then dropped by its verified spec id
    measured = load_measurements((str(records),), accept_unsigned=True)
    assert {k[0] for k in measured.table} == {"fused-liger"}  # fused-torch's record is of an A100


def test_the_reproduction_block_shows_each_protocol_with_reported_over_measured(records):
    report = _audit(SEED, records=(str(records),), accept_unsigned_records=True)
    b2 = next(a for a in report.audits if a.record.median_ms == 1.81)
    lines = b2.reproduction.lines()
    text = "\n".join(lines)
    assert lines[0].startswith("reproduction (grpo-fused-linear/token-is seed-b2, reported 1.81 ms backward-only)")
    assert "fused-liger on NVIDIA H200 (UNSIGNED" in text
    assert "forward 58.1 ms (reported/measured 0.03x)" in text and "full 118 ms (reported/measured 0.02x)" in text
    assert "backward-only 0.77 ms (reported/measured 2.35x)" in text
    assert "the reported number is a backward-only time: 2.35x ours" in text
    assert b2.reproduction.to_json()["measured"][1]["ratio"] == pytest.approx(1.81 / 0.77)


def test_no_record_of_the_workload_says_so(records):
    report = _audit(SEED, records=(str(records),), accept_unsigned_records=True)
    b4 = next(a for a in report.audits if a.record.median_ms == 1.85)  # only seed-b2 was recorded
    assert b4.reproduction.measured == () and "no H200 record of fused-liger" in b4.reproduction.lines()[0]
    torch_b2 = next(a for a in report.audits if a.record.implementation == "torch")
    assert "no H200 record of fused-torch" in torch_b2.reproduction.lines()[0]  # its record is of an A100


def test_unsigned_records_are_refused_by_default(records):
    report = _audit(SEED, records=(str(records),))
    b2 = next(a for a in report.audits if a.record.median_ms == 1.81)
    assert b2.reproduction.measured == () and "no H200 record" in b2.reproduction.lines()[0]


def test_the_cli_prints_the_source_row_and_the_reproduction_under_each_fused_row(records):
    from click.testing import CliRunner

    from grpo_conform.cli import main

    run = CliRunner().invoke(main, ["audit", "--against", str(LIGER), "--records", str(records), str(SEED)],
                             catch_exceptions=False)
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    row9 = next(i for i, ln in enumerate(lines) if ln.startswith(f"{SEED}:9 "))
    assert "NOT COMPARABLE" in lines[row9] and "fused-linear operation" in lines[row9]
    assert "backward-only protocol: " + PROTOCOL_TEXT in lines[row9] and "never a headline time" in lines[row9]
    assert "matches the sequence-level (GSPO) row of Liger's CSV at ead96b618e5c" in lines[row9 + 1]
    assert "no H200 record of fused-torch" in lines[row9 + 2]  # the synthetic records are unsigned: refused
    quiet = CliRunner().invoke(main, ["audit", "--no-reproduction", str(SEED)], catch_exceptions=False)
    assert "reproduction" not in quiet.output and "source row: unknown" in quiet.output
