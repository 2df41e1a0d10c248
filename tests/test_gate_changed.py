"""`--changed-since` against real git repositories (issue 28 point 5): a bumped or dirty submodule, a
symbolic link to changed code, a change to the toolchain that runs the validator each select every
implementation; an implementation linked from outside the checkout is always checked; a strict run
that checked nothing fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import GALLERY
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.gate.changed import changed_implementations

PASSING = GALLERY / "closed-form"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "protocol.file.allow=always", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def _impl(dst: Path, name: str) -> Path:
    shutil.copytree(PASSING, dst, ignore=shutil.ignore_patterns("expect.toml", "__pycache__"))
    toml = (dst / "implementation.toml").read_text().replace('name = "closed-form"', f'name = "{name}"')
    (dst / "implementation.toml").write_text(toml)
    return dst


def _init(repo: Path) -> None:
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")


@pytest.fixture()
def repo(tmp_path):
    repo = tmp_path / "repo"
    for name in ("alpha", "beta"):
        _impl(repo / "implementations" / name, name)
    (repo / "README.md").write_text("hello\n")
    (repo / ".ci").mkdir()
    (repo / ".ci" / "run").write_text("#!/bin/sh\npytest\n")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (repo / "action.yml").write_text("name: gate\n")
    _init(repo)
    return repo


def _args(repo: Path) -> list[str]:
    return sorted(str(p.parent) for p in (repo / "implementations").glob("*/implementation.toml"))


@pytest.fixture()
def with_submodule(repo, tmp_path):
    """`implementations/vendored`: an implementation that is a git submodule, as the review's case."""
    upstream = _impl(tmp_path / "upstream", "vendored")
    _init(upstream)
    _git(repo, "submodule", "add", "-q", str(upstream), "implementations/vendored")
    _git(repo, "commit", "-q", "-m", "vendor an implementation")
    return repo, upstream


def test_a_bumped_submodule_selects_every_implementation(with_submodule):
    repo, upstream = with_submodule
    base = _git(repo, "rev-parse", "HEAD").strip()
    assert changed_implementations(_args(repo), base)[0] == set()
    (upstream / "impl.py").write_text((upstream / "impl.py").read_text() + "\n# upstream fix\n")
    _git(upstream, "commit", "-q", "-am", "upstream change")
    sub = repo / "implementations" / "vendored"
    _git(sub, "pull", "-q", "origin", "main")
    _git(repo, "commit", "-q", "-am", "bump the submodule")  # only the gitlink changed in this repository
    assert [line.split("\t")[1] for line in _git(repo, "diff", "--raw", base).splitlines()] == \
        ["implementations/vendored"]
    chosen, note = changed_implementations(_args(repo), base)
    assert chosen == set(_args(repo)), note
    assert "submodule" in note and "implementations/vendored" in note


def test_a_submodule_set_to_be_ignored_is_not_hidden(with_submodule):
    repo, _ = with_submodule
    _git(repo, "config", "-f", ".gitmodules", "submodule.implementations/vendored.ignore", "all")
    _git(repo, "commit", "-q", "-am", "ignore the submodule")
    base = _git(repo, "rev-parse", "HEAD").strip()
    sub = repo / "implementations" / "vendored"
    (sub / "impl.py").write_text((sub / "impl.py").read_text() + "\n# changed\n")
    _git(sub, "commit", "-q", "-am", "change")
    _git(repo, "add", "implementations/vendored")
    _git(repo, "commit", "-q", "-m", "bump an ignored submodule")
    chosen, note = changed_implementations(_args(repo), base)
    assert chosen == set(_args(repo)) and "submodule" in note, note


def test_a_submodule_with_changed_content_selects_every_implementation(with_submodule):
    repo, _ = with_submodule
    with open(repo / "implementations" / "vendored" / "impl.py", "a") as f:
        f.write("\n# edited inside the submodule, not committed\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set(_args(repo)), note


def test_an_untracked_nested_repository_selects_every_implementation(repo):
    nested = repo / "implementations" / "alpha" / "third_party"
    nested.mkdir()
    _git(nested, "init", "-q")
    (nested / "k.py").write_text("X = 1\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set(_args(repo)), note


def test_a_symlinked_implementation_whose_target_changed_selects_every_implementation(repo):
    vendor = _impl(repo / "vendor" / "linked", "linked")
    os.symlink("../vendor/linked", repo / "implementations" / "linked")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "link an implementation")
    assert changed_implementations(_args(repo), "HEAD")[0] == set()
    with open(vendor / "impl.py", "a") as f:
        f.write("\n# changed where the link points\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set(_args(repo)) and "symbolic link" in note, note


def test_a_symlink_inside_an_implementation_to_changed_code_selects_every_implementation(repo):
    (repo / "shared").mkdir()
    (repo / "shared" / "kernels.py").write_text("BLOCK = 64\n")
    os.symlink("../../shared/kernels.py", repo / "implementations" / "beta" / "kernels.py")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "share a kernel")
    (repo / "shared" / "kernels.py").write_text("BLOCK = 128\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set(_args(repo)), note


def test_a_link_within_an_implementation_selects_only_that_implementation(repo):
    os.symlink("impl.py", repo / "implementations" / "beta" / "alias.py")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "an alias")
    with open(repo / "implementations" / "beta" / "impl.py", "a") as f:
        f.write("\n# a change\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == {str(repo / "implementations" / "beta")}, note


def test_an_implementation_linked_outside_the_checkout_is_always_checked(repo, tmp_path):
    outside = _impl(tmp_path / "elsewhere", "outside")
    os.symlink(outside, repo / "implementations" / "outside")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "link outside")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == {str(repo / "implementations" / "outside")} and "outside this checkout" in note


@pytest.mark.parametrize("trigger", [".ci/run", "action.yml", ".github/workflows/ci.yml", ".github/actions/x.yml",
                                     "setup.cfg", "requirements-dev.txt", "poetry.lock"])
def test_a_toolchain_change_selects_every_implementation(repo, trigger):
    (repo / trigger).parent.mkdir(parents=True, exist_ok=True)
    (repo / trigger).write_text("changed\n")
    chosen, note = changed_implementations(_args(repo), "HEAD")
    assert chosen == set(_args(repo)) and trigger in note


def test_nothing_checked_fails_under_strict(repo):
    (repo / "README.md").write_text("docs only\n")
    request = CheckRequest((str(repo / "implementations"),), device="cpu", changed_since="HEAD", timing=False)
    assert run_check(request).exit_code == 0  # not strict: nothing changed, nothing to check
    report = run_check(CheckRequest(**{**request.__dict__, "strict": True}))
    assert report.implementations == () and report.exit_code == 1
    assert "no implementation was checked" in report.strict_failures[0]
