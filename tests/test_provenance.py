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
