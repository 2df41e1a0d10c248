"""Audit of reported records: the seed page's records in both input forms, verdict rules, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_conform.audit import (FORMAT, AuditInputError, AuditRequest, parse_config_string, read_records,
                                reported_schema, run_audit)
from grpo_conform.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE

DATA = Path(__file__).resolve().parent / "data"
SPEC_FILE = str(Path(__file__).resolve().parent.parent / "specs" / "grpo-token-is.v1.json")
CSV_FILE, JSON_FILE = DATA / "seed-records.csv", DATA / "seed-records.json"
HEADER = ("kernel_name,kernel_provider,kernel_operation_mode,metric_name,metric_unit,x_name,x_label,x_value,"
          "y_value_50,y_value_20,y_value_80,extra_benchmark_config_str,gpu_name,timestamp,liger_version")
CONFIG = '"{""T"": 1024, ""V"": 128256, ""dtype"": ""torch.bfloat16""}"'


def _audit(path) -> object:
    return run_audit(AuditRequest(str(path), SPEC_FILE, records=()))


@pytest.fixture(scope="module")
def csv_report():
    return _audit(CSV_FILE)


@pytest.fixture(scope="module")
def json_report():
    return _audit(JSON_FILE)


def _key(a) -> tuple:
    return a.record.implementation.lower() == "liger", a.record.axes["batch"], a.record.median_ms


def test_seed_json_verdicts(json_report):
    """The seed page's records as the page presented them: the spec's operation (what it claimed), so
    judged against grpo-token-is. The CSV form (what Liger's benchmark timed) is the fused-linear
    operation's: tests/test_audit_fused.py."""
    assert json_report.format == FORMAT and len(json_report.audits) == 10
    by_time = {(a.record.implementation, a.record.median_ms): a for a in json_report.audits}
    b16 = by_time[("Liger", 1.97)]
    assert b16.verdict == "impossible" and b16.workload == "seed-b16"
    assert b16.finding("physics").status == "impossible"
    # traffic-v1 (issue 19): a backward-only time presented as the latency claims the gradient work: judged
    # as full (read the scored logits, write the whole gradient: 4.12 ms at batch 16 on the A100)
    assert b16.floor.protocol == "full" and b16.floor.model == "traffic-v1" and b16.floor.strict_ns > 1.97e6
    assert "4.12 ms" in b16.finding("physics").message and "traffic-v1" in b16.finding("physics").message
    assert "headroom-v1 forward floor, as the seed page computed it: 2.06 ms" in b16.finding("physics").message
    b8 = by_time[("Liger", 1.89)]
    assert b8.verdict == "impossible" and b8.workload == "seed-b8"  # 2.06 ms of full traffic at batch 8
    for a in json_report.audits:
        assert a.spec_id is None and not a.summary  # the claimed operation: not relabelled fused
        assert a.finding("protocol").status == "mismatch" and "backward-only" in a.finding("protocol").message
        assert a.finding("workload").status == "ok"
        assert not a.comparable  # backward-only
        if a not in (b16, b8):
            assert a.verdict == "plausible" and a.finding("physics").status == "ok"
    torch_rows = [a for a in json_report.audits if a.record.implementation == "PyTorch"]
    assert len(torch_rows) == 5
    assert all(a.finding("physics").status == "ok" and a.floor_ratio > 10 for a in torch_rows)
    assert json_report.counts == {"impossible": 2, "plausible": 8, "unknown-gpu": 0, "not-comparable": 10}
    assert json_report.exit_code == EXIT_FAILED


def test_the_two_forms_say_what_was_claimed_and_what_was_timed(csv_report, json_report):
    # the same numbers: claimed as the logits-level operation they are impossible; as what Liger's
    # benchmark timed (the fused operation's backward-only protocol) they are possible and not comparable
    assert sorted(a.record.median_ms for a in csv_report.audits) == \
        sorted(a.record.median_ms for a in json_report.audits)
    assert csv_report.counts == {"impossible": 0, "plausible": 10, "unknown-gpu": 0, "not-comparable": 10}
    assert all(a.spec_id == "grpo-fused-linear/token-is" for a in csv_report.audits)
    assert all(a.record.extra == {} and a.record.axes["hidden"] == 4096 for a in csv_report.audits)
    assert csv_report.exit_code == EXIT_OK


def test_seed_json_is_flagged_for_protocol_and_ambiguous_gpu(json_report):
    for a in json_report.audits:
        assert a.finding("operation").status == "ok"  # the leaderboard claimed the spec's operation
        assert a.finding("protocol").status == "mismatch"
        assert a.finding("gpu").status == "warning" and "fastest" in a.finding("gpu").message
        assert a.gpu.gpu.id == "a100-sxm4-80gb"


def test_report_serializes_and_reads(csv_report, json_report):
    out = json.loads(json.dumps(json_report.to_json()))
    assert out["exit_code"] == 1 and out["counts"]["impossible"] == 2 and out["fused_spec"] is None
    assert out["records"][4]["verdict"] == "impossible" and out["records"][4]["floor"]["model"] == "traffic-v1"
    text = "\n".join(json_report.lines())
    assert "-> impossible, not comparable" in text and "verdicts: 2 impossible, 8 plausible, 0 unknown-gpu" in text
    fused = json.loads(json.dumps(csv_report.to_json()))
    assert fused["fused_spec"]["id"] == "grpo-fused-linear/token-is" and fused["exit_code"] == 0
    assert fused["records"][4]["spec"] == "grpo-fused-linear/token-is"
    assert fused["records"][4]["floor"]["model"] == "accumulation-v1"


def _write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


def _reported(tmp_path: Path, **changes) -> Path:
    record = {"implementation": "Fast", "operation": "grpo-token-is", "protocol": "forward",
              "workload": {"batch": 2, "seq": 1024, "vocab": 128256, "dtype": "bfloat16"},
              "gpu": "NVIDIA A100-SXM4-80GB", "median_ms": 0.30, "source": "https://example.org/run"}
    record.update(changes)
    return _write(tmp_path, "r.json", json.dumps({"format": FORMAT, "records": [record]}))


def test_a_forward_record_above_its_floor_is_plausible(tmp_path):
    report = _audit(_reported(tmp_path))
    (a,) = report.audits
    assert a.verdict == "plausible" and a.workload == "seed-b2" and not a.warnings
    assert a.floor.model == "traffic-v1" and a.floor_ratio is None  # the seed forward reads 8 B: no floor to divide
    assert "headroom-v1 forward floor, as the seed page computed it: 257.9 us" in a.finding("physics").message
    assert report.exit_code == EXIT_OK


def test_a_closed_form_forward_record_is_not_impossible(tmp_path):
    # issue 19: -mean(A) without reading the logits is correct for the seed spec, however fast
    (a,) = _audit(_reported(tmp_path, median_ms=0.006)).audits
    assert a.verdict == "plausible" and a.finding("physics").status == "ok"


def test_a_full_record_is_judged_against_the_full_floor(tmp_path):
    (a,) = _audit(_reported(tmp_path, protocol="full", median_ms=0.40)).audits
    assert a.verdict == "impossible" and a.floor.protocol == "full"  # 0.40 ms < 515.8 us


def test_unknown_gpu(tmp_path):
    (a,) = _audit(_reported(tmp_path, gpu="NVIDIA Z9000")).audits
    assert a.verdict == "unknown-gpu" and a.finding("physics").status == "skipped"


def test_liger_grpo_loss_name_is_the_spec_operation_with_a_warning(tmp_path):
    (a,) = _audit(_reported(tmp_path, operation="grpo_loss")).audits
    assert a.verdict == "plausible" and a.finding("operation").status == "warning"
    assert any(w.startswith("operation:") for w in a.warnings)


def test_other_workload_is_not_comparable_but_still_checked(tmp_path):
    wl = {"batch": 2, "seq": 1024, "vocab": 32000, "dtype": "bfloat16"}
    (a,) = _audit(_reported(tmp_path, protocol="full", workload=wl, median_ms=0.01)).audits
    assert a.workload is None and a.finding("workload").status == "mismatch"
    assert a.verdict == "impossible"  # 2*1024*32000*2 B read + 2*1025*32000*2 B written cannot move in 10 us
    (b,) = _audit(_reported(tmp_path, protocol="full", workload=wl, median_ms=5.0)).audits
    assert b.verdict == "plausible" and not b.comparable and b.finding("physics").status == "ok"


def test_memory_rows_are_not_timings(tmp_path):
    rows = [HEADER,
            f"grpo_loss,liger,full,speed,ms,B,batch size,2,0.90,0.89,0.91,{CONFIG},NVIDIA H200,2026-11-30,0.8.5",
            f"grpo_loss,liger,full,memory,MB,B,batch size,2,1024.0,1024.0,1024.0,{CONFIG},NVIDIA H200,2026-11-30,0.8.5"]
    report = _audit(_write(tmp_path, "liger.csv", "\n".join(rows) + "\n"))
    assert len(report.audits) == 1 and len(report.ignored) == 1
    assert "not a timing" in report.ignored[0].reason and report.ignored[0].where == "line 3"
    (a,) = report.audits
    assert a.verdict == "plausible" and a.record.quantiles_ms == {"p20": 0.89, "p80": 0.91}


def test_microsecond_units_are_converted(tmp_path):
    row = f"grpo_loss,liger,forward,speed,us,B,batch size,2,300.0,,,{CONFIG},NVIDIA A100-SXM4-80GB,2025,0.6.1"
    (a,) = _audit(_write(tmp_path, "us.csv", HEADER + "\n" + row + "\n")).audits
    assert a.record.median_ms == pytest.approx(0.3)


@pytest.mark.parametrize("text, expected", [
    ('{"B": 8, "T": 2048, "dtype": "torch.bfloat16"}', {"B": 8, "T": 2048, "dtype": "torch.bfloat16"}),
    ("{'B': 8, 'T': 2048, 'dtype': torch.float32}", {"B": 8, "T": 2048, "dtype": "torch.float32"}),
    ("B=8, T=2048, dtype=torch.float16", {"B": 8, "T": 2048, "dtype": "torch.float16"}),
    ("", {}),
])
def test_parse_config_string(text, expected):
    assert parse_config_string(text) == expected


@pytest.mark.parametrize("content, where, field", [
    ("kernel_name,kernel_provider\nx,y\n", "line 1", "missing columns"),
    (HEADER + f"\ngrpo_loss,liger,forward,speed,ms,B,b,2,fast,,,{CONFIG},NVIDIA H200,2026,0.8\n", "line 2",
     "y_value_50"),
    (HEADER + "\ngrpo_loss,liger,forward,speed,ms,B,b,2,1.0,,,\"[[[\",NVIDIA H200,2026,0.8\n", "line 2",
     "extra_benchmark_config_str"),
    (HEADER + f"\ngrpo_loss,liger,forward,speed,furlongs,B,b,2,1.0,,,{CONFIG},NVIDIA H200,2026,0.8\n", "line 2",
     "metric_unit"),
    (HEADER + f"\ngrpo_loss,liger,forward,speed,ms,B,b,two,1.0,,,{CONFIG},NVIDIA H200,2026,0.8\n", "line 2",
     "x_value"),
    (HEADER + "\ngrpo_loss,liger,forward\n", "line 2", "fields per row"),
])
def test_malformed_csv_names_file_line_and_field(tmp_path, content, where, field):
    path = _write(tmp_path, "bad.csv", content)
    with pytest.raises(AuditInputError) as err:
        _audit(path)
    message = str(err.value)
    assert str(path) in message and where in message and field in message
    assert err.value.exit_code == EXIT_USAGE


def test_malformed_json_names_record_and_field(tmp_path):
    doc = json.loads(JSON_FILE.read_text())
    del doc["records"][3]["median_ms"]
    with pytest.raises(AuditInputError, match=r"records\[3\]\.median_ms"):
        _audit(_write(tmp_path, "bad.json", json.dumps(doc)))
    doc = json.loads(JSON_FILE.read_text())
    doc["records"][1]["protocol"] = "sideways"
    with pytest.raises(AuditInputError, match=r"records\[1\]\.protocol"):
        _audit(_write(tmp_path, "bad.json", json.dumps(doc)))
    doc["records"][1]["protocol"] = "forward"
    doc["records"][1]["median_ms"] = -1
    with pytest.raises(AuditInputError, match=r"records\[1\]\.median_ms"):
        _audit(_write(tmp_path, "bad.json", json.dumps(doc)))
    doc["records"][1]["median_ms"] = 1.0
    doc["records"][1]["workload"]["batch"] = 0
    with pytest.raises(AuditInputError, match=r"records\[1\]\.workload\.batch"):
        _audit(_write(tmp_path, "bad.json", json.dumps(doc)))
    with pytest.raises(AuditInputError, match="line 1"):
        _audit(_write(tmp_path, "broken.json", '{"format": '))
    with pytest.raises(AuditInputError, match=r"\$\.format"):
        _audit(_write(tmp_path, "other.json", json.dumps({"format": "x", "records": []})))


def test_unreadable_or_unrecognized_files(tmp_path):
    with pytest.raises(AuditInputError, match="cannot read"):
        read_records(tmp_path / "missing.csv")
    with pytest.raises(AuditInputError, match="cannot tell its form"):
        read_records(_write(tmp_path, "notes.txt", "hello\n"))
    fmt, records, _ = read_records(_write(tmp_path, "records", JSON_FILE.read_text()))
    assert fmt == FORMAT and len(records) == 10  # detected by content


def test_reported_schema_documents_the_form():
    schema = reported_schema()
    assert "records" in schema["properties"]
    assert "median_ms" in json.dumps(schema)


def test_liger_benchmark_names_map_to_members(tmp_path):
    rows = [HEADER] + [f"{name},liger,full,speed,ms,B,batch size,2,5.0,,,{CONFIG},NVIDIA H200,2026-11-30,0.8.5"
                       for name in ("grpo_loss_kernel_no_kl", "grpo_loss_kernel_with_kl",
                                    "fused_linear_grpo_loss_token", "fused_linear_grpo_loss_sequence", "softmax")]
    report = _audit(_write(tmp_path, "liger.csv", "\n".join(rows) + "\n"))
    ops = {a.record.operation: a.finding("operation") for a in report.audits}
    assert ops["grpo_loss_kernel_no_kl"].status == "ok" and "grpo/token-is" in ops["grpo_loss_kernel_no_kl"].message
    assert "identically zero" in ops["grpo_loss_kernel_no_kl"].message  # its torch baseline forgets the detach
    kl = ops["grpo_loss_kernel_with_kl"]
    assert kl.status == "mismatch" and "grpo/token-offpolicy-mask-kl" in kl.message and "--spec" in kl.message
    # the fused kernel's rows are judged as the fused operation (tests/test_audit_fused.py)
    assert ops["fused_linear_grpo_loss_token"].status == "ok" and "grpo-fused-linear" in \
        ops["fused_linear_grpo_loss_token"].message
    assert ops["fused_linear_grpo_loss_sequence"].status == "mismatch"
    assert "GSPO" in ops["fused_linear_grpo_loss_sequence"].message
    assert "nor a known name" in ops["softmax"].message


def test_operation_table():
    from grpo_conform.operations import KNOWN_OPERATIONS, lookup, measures_member

    assert lookup("GRPO-Loss-Kernel-No-KL").member_id == "grpo/token-is"
    assert lookup("fused_linear_grpo_loss_token").relation == "different" and lookup("nope") is None
    assert measures_member(lookup("grpo_loss_kernel_no_kl"), "grpo-token-is", None)
    assert measures_member(lookup("grpo_loss_kernel_with_kl"), "grpo/token-offpolicy-mask-kl", "token-offpolicy-mask-kl")
    assert not measures_member(lookup("grpo_loss_kernel_with_kl"), "grpo-token-is", None)
    assert all(op.note for op in KNOWN_OPERATIONS.values())
