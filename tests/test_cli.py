"""End to end through the command line: check (JSON and text, evidence records), floor, audit, bench,
keygen, verify; exit codes and messages as documented. The commands run through click's runner in this
process (`cli_here`), the entry point `python -m grpo_conform` as a process (`cli`: test_version_and_help;
`check` as a process, its interrupts and its slots: test_gate_e2e, test_isolation_slots, test_sandbox)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, cli_here
from grpo_conform.evidence.dsse import parse_envelope
from grpo_conform.gate.junit import WORKLOAD_CHECKS
from grpo_conform.implementations import load_implementation

PYTORCH = str(ROOT / "implementations" / "pytorch")
STATUSES = {"pass", "fail", "error", "timeout", "skipped"}


def cli(*args, cwd=ROOT, env_extra=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="1000")
    for k in ("GRPO_CONFORM_SIGNING_KEY", "GRPO_CONFORM_SIGNING_KEY_FILE"):
        env.pop(k, None)  # records must be unsigned unless a test asks for a key
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "grpo_conform", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _no_traceback(run: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in run.stdout + run.stderr, run.stderr


# -- check ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def json_run():
    return cli_here("check", PYTORCH, "--device", "cpu", "--workload", "odd-vocab", "--member", "token-is", "--format", "json",
               "--no-evidence")


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    evidence = tmp_path_factory.mktemp("evidence")
    return cli_here("check", PYTORCH, "--device", "cpu", "--workload", "batch1-seq1", "--member", "token-is",
               "--evidence-dir", evidence), evidence


@pytest.mark.slow
def test_check_json_names_every_check_with_status_and_evidence(json_run):
    assert json_run.returncode == 0, json_run.stdout[-2000:] + json_run.stderr
    report = json.loads(json_run.stdout)
    assert report["tool"] == "grpo-conform" and report["exit_code"] == 0
    assert report["triton_interpreter"] is True and report["device"]["kind"] == "cpu"
    assert report["evidence_records"] == []
    (spec,) = report["specs"]
    assert spec["id"] == "grpo/token-is" and len(spec["identity"]["sha256"]) == 64  # --member: one member
    (impl,) = report["implementations"]
    assert impl["name"] == "pytorch" and impl["status"] == "conformant"
    assert impl["message"].startswith("conformant on the checked workloads (1 of ")  # --workload: says so
    (member,) = impl["members"]
    assert member["coverage"]["workloads_run"] == ["odd-vocab"] and not member["coverage"]["complete"]
    assert impl["manifest"]["entry"] == "impl:grpo_loss"
    (workload,) = impl["workloads"]
    assert workload["workload"] == "odd-vocab"
    assert workload["axes"] == {"batch": 3, "seq": 5, "seq_next": 6, "vocab": 5003}
    assert workload["device"] == "cpu" and len(workload["seeds"]) >= 2
    assert all(isinstance(s, str) and s.isdigit() for s in workload["seeds"])  # 62-bit seeds as strings
    names = [c["check"] for c in workload["checks"]]
    # by the member's semantics: no mask here, and no old log-probs (the ratio is exactly 1)
    ruled_out = set(workload["draws"].get("not_applicable", {}))
    # ... and the fused operation's weight probes (grpo-logits differentiates no weight)
    # grad-accumulation applies (prefilled-grad's GP pre-fills the logits' .grad)
    assert ruled_out == {"masked-positions", "far-ratios", "near-ties", "tied-weights", "frozen-inputs"}
    assert sorted(names) == sorted(set(WORKLOAD_CHECKS) - ruled_out) and len(names) == len(set(names))
    for c in workload["checks"]:
        assert c["status"] in STATUSES
        assert c["status"] == "pass" or (c["status"] == "skipped" and "not applicable" in c["message"]), c
        assert isinstance(c["evidence"], dict) and isinstance(c["message"], str) and c["message"]
    by_name = {c["check"]: c for c in workload["checks"]}
    assert by_name["determinism"]["informational"] is True
    loss = by_name["loss"]["evidence"]
    assert abs(loss["actual"] - loss["expected"]) <= loss["allowed"]
    assert by_name["gradient"]["evidence"]["elements"] == 3 * 5 * 5003
    assert workload["timings"] == []  # no timing on the CPU


@pytest.mark.slow
def test_check_text_output_and_unsigned_evidence_record(text_run):
    run, evidence = text_run
    assert run.returncode == 0, run.stdout + run.stderr
    _no_traceback(run)
    out = run.stdout
    assert "Triton kernels run under TRITON_INTERPRET=1" in out
    header = next(line for line in out.splitlines() if "reason / evidence" in line)
    for col in ("workload", "check", "status"):
        assert col in header
    assert "CONFORMANT" in out
    assert out.rstrip().splitlines()[-1] == "exit code 0"
    records = sorted(Path(evidence).glob("*.intoto.json"))
    assert len(records) == 1 and records[0].name.startswith("pytorch--")
    envelope = parse_envelope(records[0].read_bytes())
    assert len(envelope.signatures) == 0
    statement = json.loads(envelope.payload)
    assert statement["predicate"]["verdict"] == "conformant" and statement["predicate"]["failedTests"] == []
    # WARNED when a check is skipped as not applicable to the member (masked-positions without a mask)
    assert statement["predicate"]["result"] in ("PASSED", "WARNED")
    impl = load_implementation(PYTORCH)
    assert statement["subject"] == [{"name": "implementations/pytorch", "digest": {"dirHash": impl.identity}}]
    assert f"evidence: {records[0]} is UNSIGNED" in " ".join(run.stderr.split())


@pytest.mark.slow
def test_verify_rejects_an_unsigned_record_unless_allowed(text_run):
    _, evidence = text_run
    (record,) = Path(evidence).glob("*.intoto.json")
    strict = cli_here("verify", record)
    assert strict.returncode == 1, strict.stdout
    assert strict.stdout.splitlines()[1].startswith(f"FAIL       {record}") and "unsigned" in strict.stdout
    assert strict.stdout.rstrip().endswith("exit code 1")
    lenient = cli_here("verify", "--allow-unsigned", record)
    assert lenient.returncode == 0, lenient.stdout
    assert "UNSIGNED" in lenient.stdout and "accepted by --allow-unsigned" in lenient.stdout
    assert "identities pass" in " ".join(lenient.stdout.split())


@pytest.mark.slow
def test_keygen_check_with_key_and_verify(tmp_path):
    private, public = tmp_path / "k.pem", tmp_path / "keys" / "k.pub.pem"
    run = cli_here("keygen", "--private-key", private, "--public-key", public)
    assert run.returncode == 0, run.stderr
    keyid = next(line.split()[-1] for line in run.stdout.splitlines() if line.startswith("key id:"))
    assert len(keyid) == 64 and private.stat().st_mode & 0o777 == 0o600
    again = cli_here("keygen", "--private-key", private, "--public-key", tmp_path / "other.pub.pem")
    assert again.returncode == 2 and "never overwrites" in again.stderr
    _no_traceback(again)

    evidence = tmp_path / "evidence"
    check = cli_here("check", PYTORCH, "--device", "cpu", "--workload", "batch1-seq1", "--member", "token-is",
                "--evidence-dir", evidence, "--key", private)
    assert check.returncode == 0, check.stdout + check.stderr
    (record,) = evidence.glob("*.intoto.json")
    assert f"(signed, key {keyid[:16]}" in check.stderr and "UNSIGNED" not in check.stderr
    assert [s.keyid for s in parse_envelope(record.read_bytes()).signatures] == [keyid]

    trusted = tmp_path / "keys" / "trusted-keys.json"
    trusted.write_text(json.dumps({"format": "grpo-conform/trusted-keys/v1", "keys": [
        {"keyid": keyid, "public_key": "k.pub.pem", "owner": "tests", "valid_from": "2020-01-01T00:00:00Z",
         "valid_until": None, "revoked": False}]}))
    ok = cli_here("verify", "--trusted-keys", trusted, record)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("TRUST OVERRIDE: keys from --trusted-keys")
    lines = ok.stdout.splitlines()  # the override line may wrap on a long temporary path
    assert any(line.startswith(f"AUTHENTIC  {record}") for line in lines) and ok.stdout.rstrip().endswith("exit code 0")
    assert not any(line.startswith(("FAIL", "UNVERIFIED")) for line in lines)

    # The shipped trust root does not hold this throw-away key.
    untrusted = cli_here("verify", record)
    assert untrusted.returncode == 1 and any(line.startswith("FAIL") for line in untrusted.stdout.splitlines())

    # A revoked key is refused.
    doc = json.loads(trusted.read_text())
    doc["keys"][0].update(revoked=True, revoked_reason="test")
    trusted.write_text(json.dumps(doc))
    assert cli_here("verify", "--trusted-keys", trusted, record).returncode == 1


@pytest.mark.slow
def test_check_cuda_on_a_machine_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = cli_here("check", PYTORCH, "--device", "cuda", "--no-evidence")
    assert run.returncode == 3
    _no_traceback(run)
    assert run.stderr.strip() == ("error: --device cuda: no CUDA device is available here (torch.cuda.is_available() "
                                  "is False); use --device cpu or auto")


def test_check_unknown_workload_names_it_and_lists_the_known_ones():
    run = cli_here("check", PYTORCH, "--device", "cpu", "--workload", "no-such-workload", "--no-evidence")
    assert run.returncode == 2
    _no_traceback(run)
    err = run.stderr.strip()
    assert "no workload named 'no-such-workload'" in err
    assert "(known: seed-b2, seed-b4, seed-b8, seed-b16, small-bf16, odd-vocab, batch1-seq1, fp32-small, " \
           "fp16-small, drawn-bf16" in err


def test_check_a_folder_without_manifest(tmp_path):
    run = cli_here("check", tmp_path, "--device", "cpu", "--no-evidence")
    assert run.returncode == 2
    _no_traceback(run)
    assert f"{tmp_path / 'implementation.toml'}: missing" in run.stderr


@pytest.mark.slow
def test_two_implementations_with_one_name_keep_two_records(tmp_path):
    folders = []
    for i in range(2):
        folder = tmp_path / f"copy{i}"
        folder.mkdir()
        (folder / "implementation.toml").write_text(
            'name = "twin"\nspec = "grpo-token-is"\nentry = "impl:grpo_loss"\nlanguage = "python"\n'
            'license = "MIT"\ndevices = ["cpu"]\ndescription = "fails at import"\n')
        (folder / "impl.py").write_text(f"# copy {i}\nimport grpo_conform_no_such_module\n")
        folders.append(folder)
    evidence = tmp_path / "evidence"
    run = cli_here("check", *folders, "--device", "cpu", "--workload", "batch1-seq1", "--evidence-dir", evidence)
    assert run.returncode == 2
    assert run.stderr.count("is UNSIGNED") == 2  # two records announced
    assert len(list(evidence.glob("*.intoto.json"))) == 2


# -- floor, audit, bench ---------------------------------------------------------------------------
def test_floor_prints_the_seed_floor():
    run = cli_here("floor", "--spec", "specs/grpo-token-is.v1.json", "--workload", "seed-b2", "--gpu", "A100 80GB",
              "--protocol", "forward")
    assert run.returncode == 0, run.stderr
    assert "forward: floor 257.9 us (dram binds)" in run.stdout
    assert "257.9 us" in run.stdout


def test_floor_json_and_bad_gpu():
    run = cli_here("floor", "--spec", "grpo-token-is", "--workload", "seed-b2", "--gpu", "A100 80GB", "--format", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)
    bad = cli_here("floor", "--spec", "grpo-token-is", "--workload", "seed-b2", "--gpu", "Voodoo 3")
    assert bad.returncode == 2 and "Voodoo 3" in bad.stderr
    _no_traceback(bad)


def test_audit_finds_the_impossible_record():
    # the seed page's records as it presented them (the logits-level operation); its CSV form is judged as the
    # fused operation Liger's benchmark timed, where nothing is impossible (tests/test_audit_fused.py)
    run = cli_here("audit", "tests/data/seed-records.json")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "impossible" in run.stdout
    assert "2 impossible" in run.stdout  # batch 8 and 16 under traffic-v1's full floor (docs/audit.md)


def test_audit_of_a_missing_file():
    run = cli_here("audit", "tests/data/no-such-file.csv")
    assert run.returncode == 2
    _no_traceback(run)
    assert "no-such-file.csv" in run.stderr


def test_bench_without_cuda_is_an_environment_problem():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = cli_here("bench", PYTORCH)
    assert run.returncode == 3
    _no_traceback(run)
    assert "no CUDA device" in " ".join(run.stderr.split())


def test_version_and_help():
    run = cli("--version")
    assert run.returncode == 0 and run.stdout.startswith("grpo-conform, version ")
    run = cli("--help")
    assert run.returncode == 0
    for command in ("check", "bench", "floor", "audit", "verify", "keygen", "sign", "spec"):
        assert command in run.stdout


def test_cli_runner_in_process(tmp_path):
    """The same entry point through click's runner: usage errors exit 2 with the message, no traceback."""
    from click.testing import CliRunner

    from grpo_conform.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["spec", "validate", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "file not found" in result.output
    result = runner.invoke(main, ["check", "--device", "tpu", PYTORCH])
    assert result.exit_code == 2 and "tpu" in result.output
