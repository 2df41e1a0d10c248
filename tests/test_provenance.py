"""Provenance: which commit a record names."""

from __future__ import annotations

from grpo_conform import provenance


def test_a_commit_named_in_the_environment_wins_over_the_checkout(monkeypatch):
    # The GPU machine's copy of the tree once carried a .git at an older commit than the tree it
    # ran: the commit the copier names is the one that describes the tree.
    monkeypatch.setenv(provenance.ENV_COMMIT, "ab" * 20)
    monkeypatch.setenv(provenance.ENV_DIRTY, "0")
    assert provenance.git_state() == {"commit": "ab" * 20, "dirty": False, "source": "environment"}


def test_without_the_environment_the_checkout_is_read(monkeypatch):
    monkeypatch.delenv(provenance.ENV_COMMIT, raising=False)
    monkeypatch.setattr(provenance, "_git", lambda *args: {"rev-parse": "cd" * 20, "status": ""}[args[0]])
    assert provenance.git_state() == {"commit": "cd" * 20, "dirty": False}


def test_an_abbreviated_commit_is_refused_before_anything_runs(monkeypatch, tmp_path):
    """An abbreviated hash cannot go into a record (the schema wants the full object name): `check` must say
    so at once, not after every workload ran (a whole H200 run was lost that way on 2026-12-02)."""
    import pytest
    from click.testing import CliRunner

    from grpo_conform.cli import main

    monkeypatch.setenv(provenance.ENV_COMMIT, "afa072f")
    with pytest.raises(provenance.ProvenanceError, match="full commit hash"):
        provenance.check_environment()
    started = []
    monkeypatch.setattr("grpo_conform.check.run_check", lambda *a, **k: started.append(1))
    result = CliRunner().invoke(main, ["check", "implementations/pytorch", "--evidence-dir", str(tmp_path)])
    assert result.exit_code == 2 and "full commit hash" in result.output and not started, result.output
    monkeypatch.setenv(provenance.ENV_COMMIT, "ab" * 20)
    monkeypatch.setenv(provenance.ENV_DIRTY, "yes")
    with pytest.raises(provenance.ProvenanceError, match="expected 0"):
        provenance.check_environment()
    monkeypatch.setenv(provenance.ENV_DIRTY, "1")
    provenance.check_environment()  # a full hash and 0/1: accepted


def test_a_profiled_run_writes_no_record(monkeypatch, tmp_path):
    """The profiling switches change the run (a parent that waits at every phase, a worker under cProfile):
    `check` refuses to write records under them, before anything runs; with --no-evidence they are fine."""
    from click.testing import CliRunner

    from grpo_conform.cli import main

    monkeypatch.delenv(provenance.ENV_COMMIT, raising=False)
    monkeypatch.setenv("GRPO_CONFORM_WORKER_PROFILE", str(tmp_path))
    started = []
    monkeypatch.setattr("grpo_conform.check.run_check", lambda *a, **k: started.append(1))
    result = CliRunner().invoke(main, ["check", "implementations/pytorch", "--evidence-dir", str(tmp_path)])
    assert result.exit_code == 2 and "GRPO_CONFORM_WORKER_PROFILE" in result.output and not started, result.output
    monkeypatch.setenv("GRPO_CONFORM_WORKER_PROFILE", "")
    monkeypatch.setenv("GRPO_CONFORM_PHASE_SYNC", "1")
    result = CliRunner().invoke(main, ["check", "implementations/pytorch", "--evidence-dir", str(tmp_path)])
    assert result.exit_code == 2 and "GRPO_CONFORM_PHASE_SYNC" in result.output, result.output
    monkeypatch.setenv("GRPO_CONFORM_PHASE_SYNC", "0")
    monkeypatch.setenv("GRPO_CONFORM_SAMPLE", str(tmp_path))  # the stack sampler (sampler.py)
    result = CliRunner().invoke(main, ["check", "implementations/pytorch", "--evidence-dir", str(tmp_path)])
    assert result.exit_code == 2 and "GRPO_CONFORM_SAMPLE" in result.output, result.output
    monkeypatch.setenv("GRPO_CONFORM_SAMPLE", "")
    provenance.check_environment()
