"""docs/scale-out/slurm-*.sh on a real Slurm (slurm-wlm and munge, started here by
tests/slurm_cluster.py): the shard array is submitted with sbatch, the merge runs behind it with
--dependency=afterok, and the merged verdicts equal a serial run of the same selection. A shard
that cannot run (exit 2) holds the merge back and Slurm cancels it. Skips, saying why, when Slurm or
munge is not installed or its daemons do not start (.ci/run installs them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import GALLERY, ROOT
from grpo_conform.check import CheckRequest, run_check
from slurm_cluster import SlurmCluster, SlurmUnavailable
from test_gate_e2e import _same, _verdicts

pytestmark = pytest.mark.slow
RECIPES = ROOT / "docs" / "scale-out"
# Two implementations, one small workload each: the cheapest selection that still fills 2 shards.
SELECTION = [str(GALLERY / "closed-form"), str(GALLERY / "loss-offset"), "--device", "cpu", "--workload", "batch1-seq1"]


@pytest.fixture
def slurm():
    cluster = SlurmCluster()
    try:
        yield cluster.start()
    except SlurmUnavailable as e:
        pytest.skip(f"no Slurm here: {e}")
    finally:
        cluster.stop()
    assert not cluster.leftovers(), "a daemon or job process outlived the cluster"


def _submit(slurm, out, check_args: list[str], key=None) -> tuple[str, str]:
    env = dict(slurm.env, GRPO_CONFORM=f"{sys.executable} -m grpo_conform",
               GRPO_CONFORM_CHECK_ARGS=" ".join(check_args),
               PYTHONPATH=str(ROOT), SBATCH_ARRAY_INX="1-2")  # the array of 2 instead of the recipe's 4
    for k in ("GRPO_CONFORM_SIGNING_KEY", "GRPO_CONFORM_SIGNING_KEY_FILE"):
        env.pop(k, None)
    if key:
        env["GRPO_CONFORM_SIGNING_KEY_FILE"] = str(key)
    run = subprocess.run(["bash", str(RECIPES / "slurm-submit.sh"), str(out)], cwd=slurm.dir, env=env,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    merge = run.stdout.strip().split(";")[0]
    return str(int(merge) - 1), merge  # the array was submitted just before, by the same script


@pytest.fixture
def serial():
    """The serial run of SELECTION in this process (the JSON document `check --format json` prints is the
    report's to_json, as test_gate_e2e's `serial`): a CLI subprocess cost a python, torch and a zygote
    more, beside the shards' own on 2 cores. Before the cluster starts (the test asks for it first): a
    validator ends the children of its process that are in another session as escaped worker
    descendants (isolation/reaper.py), and the Slurm daemons are this process's children in theirs."""
    report = run_check(CheckRequest((str(GALLERY / "closed-form"), str(GALLERY / "loss-offset")), device="cpu",
                                    workloads=("batch1-seq1",)))
    return json.loads(json.dumps(report.to_json())), [i.message for i in report.implementations]


def test_slurm_array_and_afterok_merge_equal_the_serial_run(serial, slurm, tmp_path):
    started = time.monotonic()
    doc, err = serial
    keygen = subprocess.run([sys.executable, "-m", "grpo_conform", "keygen", "--private-key", tmp_path / "key.pem",
                             "--public-key", tmp_path / "key.pub.pem"], check=True, capture_output=True, text=True)
    keyid = next(line.split()[-1] for line in keygen.stdout.splitlines() if line.startswith("key id:"))
    trusted = tmp_path / "trusted-keys.json"
    trusted.write_text(json.dumps({"format": "grpo-conform/trusted-keys/v1", "keys": [
        {"keyid": keyid, "public_key": "key.pub.pem", "owner": "tests", "valid_from": "2020-01-01T00:00:00Z",
         "valid_until": None, "revoked": False}]}))
    out = slurm.dir / "results"
    array, merge = _submit(slurm, out, SELECTION, key=tmp_path / "key.pem")
    assert slurm.job(array)["ArrayTaskId"] in ("1-2", "1", "2")
    finished = slurm.wait_idle(240)
    assert finished, f"the jobs did not finish: {slurm.out('squeue')}\n{slurm.log_tail()}"
    logs = "\n".join(p.read_text() for p in sorted(slurm.dir.glob("grpo-conform-*.log")))
    job = slurm.job(merge)
    # the merge ran and gave the verdict: exit 1, as the serial run (loss-offset fails `loss`)
    assert (job.get("JobState"), job.get("ExitCode")) == ("FAILED", "1:0"), f"{job}\n{logs}"

    shards = [json.loads((out / f"shard-{i}" / "report.json").read_text()) for i in (1, 2)]
    assert [d["shard"] for d in shards] == ["1/2", "2/2"]
    assert sorted(len(d["implementations"]) for d in shards) == [1, 1], "one implementation per shard"
    # each shard's bundle: its report and its records, signed where it ran, verifying on their own
    records = [r for i in (1, 2) for r in (out / f"shard-{i}").glob("*.intoto.json")]
    assert {r.parent.name for r in records} == {"shard-1", "shard-2"}, records
    verify = subprocess.run([sys.executable, "-m", "grpo_conform", "verify", "--trusted-keys", trusted, *records],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert sum(line.startswith("AUTHENTIC") for line in verify.stdout.splitlines()) == len(records), verify.stdout
    ends = [slurm.job(f"{array}_{i}")["EndTime"] for i in (1, 2)]
    assert job["StartTime"] >= max(ends), f"the merge started ({job['StartTime']}) before a shard ended ({ends})"

    merged = json.loads((out / "merged.json").read_text())
    assert doc["exit_code"] == merged["exit_code"] == 1, err  # loss-offset fails its `loss` check
    _same(_verdicts(merged), _verdicts(doc))
    assert (out / "merged-junit.xml").read_text().count("<testcase") >= 20
    print(f"slurm array + merge + serial: {time.monotonic() - started:.1f} s")


def test_a_shard_that_cannot_run_holds_the_merge_back(slurm):
    out = slurm.dir / "broken"
    # exit 2 from click's own check of --device, before any import: what the recipe sees of any usage
    # error (until 2026-12-03 an unknown workload, found after ~4 s of importing torch and reading the
    # spec, in both shards at once)
    bad = [str(GALLERY / "closed-form"), "--device", "no-such-device", "--workload", "batch1-seq1"]
    array, merge = _submit(slurm, out, bad)
    assert slurm.wait_idle(90), slurm.out("squeue")
    assert slurm.job(merge).get("JobState") == "CANCELLED"  # afterok never satisfied: --kill-on-invalid-dep
    assert slurm.job(f"{array}_1").get("JobState") == "FAILED"
    assert not (out / "merged.json").exists() or not (out / "merged.json").read_text()
