"""tools/compare_verdicts.py: equal reports agree, a changed or missing verdict is reported (exit 1)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "compare_verdicts.py"


def _report(status_b: str, extra: bool = False) -> dict:
    checks = [{"check": "gradient", "status": "pass"}, {"check": "loss", "status": status_b}]
    if extra:
        checks.append({"check": "finite", "status": "pass"})
    member = {"spec": {"id": "grpo/token-is"}, "workloads": [{"workload": "small-bf16", "checks": checks}]}
    return {"implementations": [{"name": "pytorch", "status": "conformant", "members": [member]}]}


def _run(tmp_path, *reports) -> subprocess.CompletedProcess:
    paths = []
    for i, r in enumerate(reports):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    return subprocess.run([sys.executable, str(SCRIPT), *paths], capture_output=True, text=True)


def test_equal_reports_agree(tmp_path):
    run = _run(tmp_path, _report("pass"), _report("pass"))
    assert run.returncode == 0 and "3 of 3 verdicts equal" in run.stdout


def test_changed_and_missing_verdicts_are_reported(tmp_path):
    run = _run(tmp_path, _report("pass"), _report("fail"), _report("pass", extra=True))
    assert run.returncode == 1
    assert "pytorch / grpo/token-is / small-bf16 / loss: pass in r0.json, fail here" in run.stdout
    assert "extra: pytorch / grpo/token-is / small-bf16 / finite" in run.stdout
