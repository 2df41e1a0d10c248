"""benchmarks/results_table.py: the README's table from the committed, signed records."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "results_table.py"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_table_of_the_round_10_records():
    run = _run("evidence/h200", "--since", "20261202T10", "--impl", "triton")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("| member, workload | protocol | triton |")
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in lines[2:]}
    # the seed batches in numeric order, then the masked members; each cell median (x floor), wall
    order = [k for k in rows if k[0].startswith("token-is")]
    assert [k[0] for k in order[::3]] == ["token-is, seed-b2", "token-is, seed-b8", "token-is, seed-b16"]
    assert "0.290 (1.18x), 0.341" in rows[("token-is, seed-b2", "full")]
    assert "1.004 (1.18x)" in rows[("token-offpolicy-mask, mask-b8", "full")]  # the per-call masked ratio


def test_no_timed_record_is_an_error():
    run = _run("evidence/h200", "--since", "29991231")
    assert run.returncode == 1 and "no timed records" in run.stderr
