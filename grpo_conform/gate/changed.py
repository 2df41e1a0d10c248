"""`--changed-since REF`: check only the implementation folders a change touched.

The changed files are those that differ between REF and the working tree (`git diff --name-only
REF`, so committed, staged and unstaged changes all count) plus untracked files git does not
ignore. Every implementation is checked when a change touches what judges them all: the
validator (`grpo_conform/`), a spec (`specs/`, or the `--spec` file), the dependency and lock
files (`pyproject.toml`, `*.lock`, `requirements*.txt`, `constraints*.txt`).
"""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path, PurePosixPath

from grpo_conform.errors import GrpoConformError

GLOBAL_DIRS = ("grpo_conform/", "specs/")
GLOBAL_FILES = ("pyproject.toml", "*.lock", "requirements*.txt", "constraints*.txt")


class GitError(GrpoConformError):
    """--changed-since needs a git checkout and a ref git knows."""


def _git(cwd: Path, *args: str) -> str:
    try:
        run = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise GitError("--changed-since needs git, which is not installed here") from None
    if run.returncode != 0:
        raise GitError(f"--changed-since: `git {' '.join(args)}` failed in {cwd}: {run.stderr.strip()} "
                       "(in CI, fetch the base ref first, e.g. actions/checkout with fetch-depth: 0)")
    return run.stdout


def changed_files(root: Path, ref: str) -> list[str]:
    _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    diff = _git(root, "diff", "--name-only", "--no-renames", ref, "--")
    untracked = _git(root, "ls-files", "--others", "--exclude-standard")
    return sorted({line for line in (diff + untracked).splitlines() if line})


def is_global(path: str, spec_path: str | None, root: Path) -> bool:
    if any(path.startswith(d) for d in GLOBAL_DIRS):
        return True
    name = PurePosixPath(path).name
    if any(fnmatch.fnmatchcase(name, g) for g in GLOBAL_FILES) and "/" not in path.strip("/"):
        return True
    if spec_path:
        try:
            return (root / path).resolve() == Path(spec_path).resolve()
        except OSError:
            return False
    return False


def changed_implementations(args: list[str], ref: str, spec_path: str | None = None) -> tuple[set[str], str]:
    """The implementation folders (as given in `args`) that changed since `ref`, and a note saying why."""
    if not args:
        return set(), f"--changed-since {ref}: no implementation folder given"
    root = Path(_git(Path(args[0]).resolve(), "rev-parse", "--show-toplevel").strip())
    files = changed_files(root, ref)
    trigger = next((f for f in files if is_global(f, spec_path, root)), None)
    if trigger is not None:
        return set(args), (f"--changed-since {ref}: {trigger} changed (validator, spec or lock file): "
                           f"checking all {len(args)} implementations")
    chosen = set()
    for a in args:
        try:
            rel = Path(a).resolve().relative_to(root).as_posix().rstrip("/") + "/"
        except ValueError:
            continue  # outside this checkout: git knows nothing of it
        if any(f.startswith(rel) for f in files):
            chosen.add(a)
    names = ", ".join(sorted(Path(a).name for a in chosen)) or "none"
    return chosen, (f"--changed-since {ref}: {len(files)} files changed; implementations changed: {names} "
                    f"({len(args) - len(chosen)} unchanged, not checked)")
