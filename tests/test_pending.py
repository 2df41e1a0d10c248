"""pending/: patches for implementations/triton that wait for a GPU (their README says why and what must run).
A device part applies them to its copy of the tree (h200_evidence.sh s48), so they must keep applying to main:
a change to a file they touch fails here, and the patch is then refreshed with that change (or dropped)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import ROOT

PATCHES = sorted((ROOT / "pending").glob("*/*.patch"))


def _applies(patch, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "apply", "--check", str(patch)], cwd=cwd, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_pending_patch_applies_to_main(patch):
    run = _applies(patch, ROOT)
    assert run.returncode == 0, f"{patch.relative_to(ROOT)} no longer applies: refresh it ({run.stderr.strip()[:500]})"
    assert (patch.parent / "README.md").is_file(), "a pending patch says in its README why it waits and for what"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_patch_whose_context_moved_is_refused(tmp_path):
    """The check above can fail: the same patch against a copy of its files with one context line changed."""
    if not PATCHES:
        pytest.skip("nothing pending")
    patch = PATCHES[0]
    text = patch.read_text()
    files = sorted({line.split(" b/", 1)[1] for line in text.splitlines() if line.startswith("diff --git a/")})
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert _applies(patch, tmp_path).returncode == 0  # the copy is a faithful stand-in
    first = tmp_path / files[0]
    hunk = next(line for line in text.splitlines() if line.startswith("@@ "))
    start = int(hunk.split(" ")[1].split(",")[0].lstrip("-"))
    lines = first.read_text().splitlines(keepends=True)
    lines[start - 1 : start + 2] = ["# changed on main\n"] * 3  # the first hunk's leading context, rewritten
    first.write_text("".join(lines))
    assert _applies(patch, tmp_path).returncode != 0
