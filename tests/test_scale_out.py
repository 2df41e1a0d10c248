"""The scale-out recipes of docs/scale-out.md are the files under docs/scale-out/, and these tests
read those files: the Actions workflow passes actionlint, the Kubernetes Jobs validate against the
batch/v1 Job schema (vendored, offline), the Slurm scripts parse, and every option they pass exists.
The Slurm recipe is also run on a real Slurm in tests/test_scale_out_slurm.py."""

from __future__ import annotations

import functools
import json
import re
import subprocess

import jsonschema
import pytest
import yaml

from conftest import ROOT
from test_gate import _actionlint, _flags_of

RECIPES = ROOT / "docs" / "scale-out"
SCHEMA = ROOT / "tests" / "data" / "k8s-job-batch-v1.37.0.schema.json"


@functools.cache
def _job_validator():
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _jobs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((RECIPES / name).read_text()) if d]


def test_docs_name_every_recipe_file():
    text = (ROOT / "docs" / "scale-out.md").read_text()
    files = sorted(p.name for p in RECIPES.iterdir())
    assert files and all(f"scale-out/{f}" in text for f in files), files


def test_shard_workflow_passes_actionlint():
    cmd = _actionlint()
    if cmd is None:
        pytest.skip("actionlint is not installed (pip install -e '.[test]')")
    run = subprocess.run([*cmd, "-no-color", str(RECIPES / "shards.yml")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_shard_workflow_is_a_matrix_merged_by_a_dependent_job():
    wf = yaml.safe_load((RECIPES / "shards.yml").read_text())
    shards = wf["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    step = next(s for s in wf["jobs"]["shard"]["steps"] if "grpo-conform" in s.get("uses", ""))
    assert step["with"]["shard"] == "${{ matrix.shard }}/%d" % len(shards) and shards == list(range(1, len(shards) + 1))
    assert step["with"]["strict"] == "false"
    merge = wf["jobs"]["merge"]
    assert merge["needs"] == "shard" and merge["if"] == "always()"
    assert any("grpo-conform merge --strict" in s.get("run", "") for s in merge["steps"])


@pytest.mark.parametrize("name", ["indexed-job.yaml", "merge-job.yaml"])
def test_kubernetes_jobs_validate_against_the_job_schema(name):
    validator = _job_validator()
    for doc in _jobs(name):
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, errors


def test_the_job_schema_refuses_what_kubernetes_refuses():
    """The vendored schema is not vacuous: an unknown field, a wrong type and a missing container
    name are refused, as the API server would."""
    validator = _job_validator()
    (job,) = _jobs("indexed-job.yaml")
    container = job["spec"]["template"]["spec"]["containers"][0]
    for path, broken in ((("spec", "parallelism"), "four"), (("spec", "completionIndex"), 1)):
        doc = json.loads(json.dumps(job))
        doc[path[0]][path[1]] = broken
        assert list(validator.iter_errors(doc)), f"{path} = {broken!r} was accepted"
    doc = json.loads(json.dumps(job))
    doc["spec"]["template"]["spec"]["containers"][0] = {k: v for k, v in container.items() if k != "name"}
    assert list(validator.iter_errors(doc)), "a container without a name was accepted"


def test_indexed_job_gives_each_pod_one_shard():
    (job,) = _jobs("indexed-job.yaml")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert spec["parallelism"] == n
    script = "\n".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "I=$((JOB_COMPLETION_INDEX + 1))" in script  # the index is 0-based, --shard 1-based
    assert f'--shard "$I/{n}"' in script
    (merge,) = _jobs("merge-job.yaml")
    assert "grpo-conform merge --strict shard-*/report.json" in "\n".join(merge["spec"]["template"]["spec"]
                                                                          ["containers"][0]["args"])


def test_slurm_scripts_parse_and_chain_the_merge_after_the_array():
    for name in ("slurm-array.sh", "slurm-merge.sh", "slurm-submit.sh"):
        run = subprocess.run(["bash", "-n", str(RECIPES / name)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    array = (RECIPES / "slurm-array.sh").read_text()
    assert re.search(r"^#SBATCH --array=1-\d+$", array, re.M)
    assert '--shard "$I/$N"' in array and "I=$SLURM_ARRAY_TASK_ID" in array and "N=$SLURM_ARRAY_TASK_COUNT" in array
    submit = (RECIPES / "slurm-submit.sh").read_text()
    assert '--dependency="afterok:$array"' in submit and "--kill-on-invalid-dep=yes" in submit


def test_recipes_use_only_options_that_exist():
    check, merge = _flags_of("check"), _flags_of("merge")
    for path in sorted(RECIPES.iterdir()):
        text = path.read_text()
        for command, flags in (("check", check), ("merge", merge)):
            calls = re.findall(rf"(?:grpo-conform|\$GRPO_CONFORM)\s+{command}\b(.*?)(?:>|$)",
                               text.replace("\\\n", " "), re.M)
            assert calls or command not in path.stem, path.name
            for call in calls:
                used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", call))
                assert used <= flags, f"{path.name}: grpo-conform {command} has no {sorted(used - flags)}"
