"""The statement: built from a real check run and from synthetic reports; canonical bytes; schema."""

from __future__ import annotations

import copy
import json
import math

import pytest

from grpo_conform.canonical import canonical_bytes, sha256_hex
from grpo_conform.evidence import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    StatementError,
    VerifyRequest,
    build_statement,
    run_verify,
    schema_problems,
    statement_bytes,
    write_evidence,
    write_record,
)
from grpo_conform.evidence.dsse import loads_strict, parse_envelope
from grpo_conform.evidence.statement import json_ready
from grpo_conform.evidence.statement import PROJECT_ROOT
from test_evidence_support import make_project, new_key, outcome, synthetic_impl, synthetic_report
from test_evidence_support import trust_list as trust

PYTORCH = PROJECT_ROOT / "implementations" / "pytorch"


@pytest.fixture(scope="module")
def real_report():
    """One real CPU run (about 5 s) shared by this module: the record builder on what check produces."""
    from grpo_conform.check import CheckRequest, run_check  # imported here: a broken check fails only these

    return run_check(CheckRequest((str(PYTORCH),), device="cpu", workloads=("batch1-seq1",)))


@pytest.fixture()
def proj(tmp_path, monkeypatch):
    project = make_project(tmp_path / "proj")
    monkeypatch.chdir(project)
    return project


def _impl(proj, **kw):
    return synthetic_impl(proj / "implementations" / "pytorch", **kw)


def _statement(proj, **kw):
    impl = _impl(proj, **kw)
    return build_statement(synthetic_report(proj, impl), impl)


def test_real_report_statement(real_report) -> None:
    impl = real_report.implementations[0]
    member = next(m for m in impl.members if m.spec.member == "token-is")
    st = build_statement(real_report, impl, member)
    assert schema_problems(st) == []
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    assert st["subject"] == [{"name": "implementations/pytorch", "digest": {"dirHash": impl.identity}}]
    p = st["predicate"]
    # PASSED, or WARNED when a check was skipped or an informational one did not pass on this machine
    assert p["verdict"] == "conformant" and p["result"] == ("WARNED" if p["warnedTests"] else "PASSED")
    assert p["failedTests"] == [] and "batch1-seq1/gradient" in p["passedTests"]
    spec = member.spec
    assert {k: p["spec"][k] for k in ("id", "version", "identity")} == \
        {"id": spec.id, "version": spec.version, "identity": spec.identity}
    assert p["spec"]["file_sha256"] == sha256_hex(open(spec.source, "rb").read())
    assert p["configuration"][0]["digest"] == {"sha256": p["spec"]["file_sha256"], "rfc8785Sha256": spec.identity}
    assert p["coverage"]["workloads_run"] == ["batch1-seq1"] and not p["coverage"]["complete"]
    assert p["run"]["builder"]["id"] and p["hardware"]["self_reported"] is True
    assert p["configuration"][0]["uri"].startswith("specs/")
    assert p["implementation"]["path"] == "implementations/pytorch" and p["implementation"]["license"]
    assert p["workloads"] == [w.to_json() for w in member.workloads]
    assert p["spec"]["member"] == "token-is" and p["spec"]["id"] == member.spec.id
    assert p["hardware"]["device"] == real_report.device and p["software"] == real_report.software
    assert p["run"]["started"].endswith("Z") and p["run"]["finished"].endswith("Z")
    assert p["run"]["compile_cache"] in ("fresh", "reused")  # the worker's stores (isolation/compile_cache.py)
    data = statement_bytes(st)  # the whole real report serializes under RFC 8785
    # read back as `verify` reads it: RFC 8785 prints an integral double below 1e21 without an exponent (an
    # allowance of 4.2e19 came out of one run), so a plain json.loads gives an int and a flaky inequality
    assert loads_strict(data) == st and canonical_bytes(loads_strict(data)) == data


def test_real_report_round_trip(real_report, tmp_path) -> None:
    key = new_key()
    trusted = trust(tmp_path, (key, {"valid_from": "2020-01-01T00:00:00Z"}))
    written = write_evidence(real_report, tmp_path / "out", key)
    assert [w.signed for w in written] == [True] and written[0].path.endswith(".intoto.json")
    report = run_verify(VerifyRequest(tuple(w.path for w in written), trusted, project=str(PROJECT_ROOT)))
    assert report.exit_code == 0, report.to_json()
    f = report.files[0]
    assert [s.status for s in f.steps] == ["pass"] * 5 + ["not-applied"]
    assert f.record_identity == written[0].record_identity
    assert {c.kind: c.status for c in f.identities} == {"spec-file": "match", "implementation": "match"} or \
        {c.kind: c.status for c in f.identities} == {"spec-file": "match", "spec": "match", "implementation": "match"}
    json.dumps(report.to_json())


def test_outcome_lists_and_result(proj) -> None:
    outcomes = (outcome("loss", "pass"), outcome("gradient", "fail"), outcome("finite", "skipped"),
                outcome("determinism", "fail", informational=True), outcome("freshness", "timeout"))
    st = _statement(proj, status="failed", outcomes=outcomes)
    p = st["predicate"]
    assert p["passedTests"] == ["seed-b2/loss"]
    assert p["failedTests"] == ["seed-b2/gradient", "seed-b2/freshness"]
    assert p["warnedTests"] == ["seed-b2/finite", "seed-b2/determinism"]
    assert p["result"] == "FAILED" and schema_problems(st) == []


@pytest.mark.parametrize("status, outcomes, result", [
    ("conformant", (outcome("loss", "pass"),), "PASSED"),
    ("conformant", (outcome("loss", "pass"), outcome("determinism", "fail", informational=True)), "WARNED"),
    ("conformant", (outcome("loss", "pass"), outcome("finite", "skipped")), "WARNED"),
    ("skipped", (), "FAILED"),
    ("load-error", (), "FAILED"),
])
def test_result_rules(proj, status, outcomes, result) -> None:
    st = _statement(proj, status=status, outcomes=outcomes)
    assert st["predicate"]["result"] == result and schema_problems(st) == []


def test_hardware_section_is_embedded(proj) -> None:
    hardware = {"gpu": "NVIDIA H200", "datasheet": {"hbm_bytes_per_s": 4_800_000_000_000},
                "measured": {"copy_bytes_per_s": 4_100_000_000_000, "fraction": 0.854}, "device": {"x": 1}}
    impl = _impl(proj)
    report = synthetic_report(proj, impl)
    report = type(report)(**{**report.__dict__, "hardware": hardware})
    st = build_statement(report, impl)
    hw = st["predicate"]["hardware"]
    assert hw["device"] == {"kind": "cpu", "name": "x86_64"} and hw["reported_device"] == {"x": 1}
    assert hw["measured"]["fraction"] == 0.854 and hw["gpu"] == "NVIDIA H200"


@pytest.mark.parametrize("cache, said", [({"reused_files": 3}, "reused"), ({"reused_files": 0}, "fresh"),
                                         ({"off": "GRPO_CONFORM_WORKER_CACHE=0"}, "off"), (None, None)])
def test_the_record_says_whether_compiled_kernels_were_reused(proj, cache, said) -> None:
    import dataclasses

    impl = _impl(proj)
    impl = dataclasses.replace(impl, worker={"pid": 1, **({"compile_cache": cache} if cache else {})})
    st = build_statement(synthetic_report(proj, impl), impl)
    assert st["predicate"]["run"].get("compile_cache") == said and schema_problems(st) == []


def test_json_ready_makes_reports_serializable() -> None:
    np = pytest.importorskip("numpy")
    value = {"nan": math.nan, "inf": -math.inf, "ptr": 2**60, "ok": 2**53 - 1, "t": (1, 2.5),
             "np": np.int64(3), "npf": np.float32(0.5)}
    ready = json_ready(value)
    assert ready == {"nan": "nan", "inf": "-inf", "ptr": str(2**60), "ok": 2**53 - 1, "t": [1, 2.5],
                     "np": 3, "npf": 0.5}
    canonical_bytes(ready)
    with pytest.raises(StatementError, match=r"\$\.bad: a set"):
        json_ready({"bad": {1}})
    with pytest.raises(StatementError, match="key 1"):
        json_ready({1: 2})


def test_nan_evidence_in_a_report_still_serializes(proj) -> None:
    st = _statement(proj, status="failed", outcomes=(outcome("loss", "fail", actual=math.nan, storage=[2**62, 8]),))
    ev = st["predicate"]["workloads"][0]["checks"][0]["evidence"]
    assert ev == {"actual": "nan", "storage": [str(2**62), 8]}
    statement_bytes(st)


def test_seeds_are_strings_and_durations_integers(proj) -> None:
    w = _statement(proj)["predicate"]["workloads"][0]
    assert w["seeds"] == ["2464000050388509931", "7"]
    assert isinstance(w["timings"][0]["median_ns"], int)


def test_payload_is_canonical_and_record_identity_is_its_sha256(proj, tmp_path) -> None:
    st = _statement(proj)
    written = write_record(st, tmp_path / "r.json", None)
    envelope = parse_envelope((tmp_path / "r.json").read_bytes())
    assert envelope.payload == canonical_bytes(st) and written.record_identity == sha256_hex(envelope.payload)
    assert not written.signed and envelope.signatures == ()
    assert json.loads((tmp_path / "r.json").read_text())["signatures"] == []


@pytest.mark.parametrize("mutate, where", [
    (lambda s: s["predicate"].update(result="OK"), "$.predicate.result"),
    (lambda s: s["predicate"]["run"].update(finished="2026-12-01 10:00:05"), "$.predicate.run.finished"),
    (lambda s: s["subject"][0]["digest"].update(dirHash="ABC"), "$.subject[0].digest.dirHash"),
    (lambda s: s["subject"][0]["digest"].update(sha256="a" * 64), "$.subject[0].digest"),
    (lambda s: s["subject"].append(dict(s["subject"][0])), "$.subject"),
    (lambda s: s["predicate"]["implementation"].update(path="../x"), "$.predicate.implementation.path"),
    (lambda s: s["predicate"]["implementation"].update(path="/etc"), "$.predicate.implementation.path"),
    (lambda s: s["predicate"].pop("coverage"), "'coverage' is a required property"),
    (lambda s: s["predicate"]["run"].pop("builder"), "'builder' is a required property"),
    (lambda s: s["predicate"].pop("spec"), "'spec' is a required property"),
    (lambda s: s["predicate"].update(failedTests=["seed-b2/loss"]), "FAILED"),
    (lambda s: s.update(predicateType="https://in-toto.io/attestation/test-result/v0.1"), "$.predicateType"),
    (lambda s: s["predicate"]["workloads"][0].update(seeds=[7]), "$.predicate.workloads[0].seeds[0]"),
])
def test_schema_rejects(proj, mutate, where) -> None:
    st = copy.deepcopy(_statement(proj))
    mutate(st)
    problems = schema_problems(st)
    assert problems and any(where in p for p in problems), problems
    with pytest.raises(StatementError, match="breaks evidence-statement.v2.schema.json"):
        write_record(st, "/nonexistent/never-written.json", None)


def test_schema_allows_extra_fields(proj) -> None:
    st = copy.deepcopy(_statement(proj))
    st["predicate"]["workloads"][0]["checks"][0]["evidence"]["anything"] = {"nested": [1, "x", None]}
    st["predicate"]["future_field"] = True
    st["extra"] = 1
    assert schema_problems(st) == []


def test_large_integral_doubles_read_back_as_doubles() -> None:
    """RFC 8785 writes 4.198706331037212e19 as 41987063310372120000; read back with `loads_strict` it is the
    same double (json.loads gives an int of another value, and rfc8785 refuses to write that int again)."""
    st = {"allowed": 4.198706331037212e19, "small": 3, "exact": 2.0**53}
    data = statement_bytes(st)
    assert b"41987063310372120000" in data
    back = loads_strict(data)
    assert back == st and isinstance(back["allowed"], float) and canonical_bytes(back) == data
    assert json.loads(data)["allowed"] != st["allowed"]  # what the flaky assertion used to compare
