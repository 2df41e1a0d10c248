"""tools/results_table.py: the README's table from the committed, signed records."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "results_table.py"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_table_of_the_round_10_records():
    run = _run("evidence/h200", "--since", "20261202T10", "--until", "20261202T11", "--impl", "triton")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("| member, workload | protocol | triton |")
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in lines[2:]}
    # the seed batches in numeric order, then the masked members; each cell median (x floor), wall
    order = [k for k in rows if k[0].startswith("token-is")]
    assert [k[0] for k in order[::3]] == ["token-is, seed-b2", "token-is, seed-b8", "token-is, seed-b16"]
    assert "0.290 (1.18x), 0.341" in rows[("token-is, seed-b2", "full")]
    assert "1.004 (1.18x)" in rows[("token-offpolicy-mask, mask-b8", "full")]  # the per-call masked ratio


def test_round_11_run_has_every_implementation():
    """The README's table: one run (device calls 11-14) with a column for every bundled implementation."""
    run = _run("evidence/h200", "--since", "20261202T113", "--until", "20261202T1201", "--impl", "triton")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = [c.strip() for c in lines[0].split("|")[3:-1]]
    assert header[0] == "triton" and set(header) == {"triton", "liger", "pytorch", "torch-compile", "liger-inplace"}
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in lines[2:]}
    assert "0.291 (1.18x), 0.348" in rows[("token-is, seed-b2", "full")]
    assert "1.011 (1.17x)" in rows[("token-offpolicy-mask, mask-b8", "full")]
    def cells(key):
        return [c.strip() for c in rows[key].split("|")[3:-1]]

    assert "-" not in cells(("token-is, seed-b16", "full"))  # every column timed at b16...
    assert cells(("token-is, seed-b8", "full")).count("-") == 3  # ...b8 only ours and Liger's


def test_an_empty_window_is_an_error():
    run = _run("evidence/h200", "--since", "20261202T10", "--until", "20261202T10")
    assert run.returncode == 1 and "no timed records" in run.stderr


def test_no_timed_record_is_an_error():
    run = _run("evidence/h200", "--since", "29991231")
    assert run.returncode == 1 and "no timed records" in run.stderr
