"""`--changed-since REF`: check only the implementation folders a change touched.

The changed files are those that differ between REF and the working tree (`git diff REF`, so
committed, staged and unstaged changes all count) plus untracked files git does not ignore.

Every implementation is checked when a change touches what judges them all or what a path prefix
cannot see (issue 28 point 5):
- the validator (`grpo_conform/`), a spec (`specs/`, or the `--spec` file);
- the toolchain that runs it: `.ci/`, `action.yml`, `.github/workflows/`, `.github/actions/`, and
  the dependency and lock files at the root (`pyproject.toml`, `setup.py`, `setup.cfg`, `*.lock`,
  `requirements*.txt`, `constraints*.txt`, `Pipfile`) and `.gitmodules`;
- a gitlink (a submodule bumped, added, removed or with changed content; an untracked nested
  repository): git reports only the submodule's path, not which of its files changed, and vendored
  code may be reached from several implementations;
- a symbolic link an implementation folder is, or holds, whose target (or the link itself) changed:
  the change is outside the folder's path, and other implementations may link to the same place.
An implementation folder that is, or links to, something outside the checkout is always checked:
git cannot see changes there.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
from pathlib import Path, PurePosixPath

from grpo_conform.errors import GrpoConformError

GLOBAL_DIRS = ("grpo_conform/", "specs/", ".ci/", ".github/workflows/", ".github/actions/")
GLOBAL_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "*.lock", "requirements*.txt",
                "constraints*.txt", "action.yml", "action.yaml", ".gitmodules")  # at the root of the checkout
GITLINK_MODE = "160000"


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


def changes(root: Path, ref: str) -> tuple[list[str], set[str]]:
    """(every changed path, the changed paths that are gitlinks on either side or nested repositories)."""
    _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    # --ignore-submodules=none: a `submodule.<name>.ignore` setting (in .gitmodules or the git config)
    # must not hide a bump from the gate
    raw = _git(root, "diff", "--raw", "-z", "--no-renames", "--no-abbrev", "--ignore-submodules=none", ref,
               "--").split("\0")
    files: set[str] = set()
    gitlinks: set[str] = set()
    for meta, path in zip(raw[0::2], raw[1::2]):  # ":<old mode> <new mode> <old sha> <new sha> <status>", path
        if not path:
            continue
        files.add(path)
        if GITLINK_MODE in meta.lstrip(":").split()[:2]:
            gitlinks.add(path)
    for path in _git(root, "ls-files", "--others", "--exclude-standard", "-z").split("\0"):
        if path:
            files.add(path.rstrip("/"))
            if path.endswith("/"):  # git lists an untracked nested repository as a folder, not its files
                gitlinks.add(path.rstrip("/"))
    return sorted(files), gitlinks


def changed_files(root: Path, ref: str) -> list[str]:
    return changes(root, ref)[0]


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


def _inside(path: Path, root: Path) -> str | None:
    """`path` relative to `root` in POSIX form, or None when it is outside."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def _touches(files: list[str], rel: str) -> bool:
    rel = rel.rstrip("/")
    return any(f == rel or f.startswith(rel + "/") for f in files)


def _links(folder: Path) -> list[Path]:
    """The folder itself when it is a symbolic link, and every link inside it (not followed)."""
    found = [folder] if folder.is_symlink() else []
    for base, dirs, names in os.walk(folder):
        found += [Path(base, n) for n in dirs + names if os.path.islink(os.path.join(base, n))]
    return found


def changed_implementations(args: list[str], ref: str, spec_path: str | None = None) -> tuple[set[str], str]:
    """The implementation folders (as given in `args`) that changed since `ref`, and a note saying why."""
    if not args:
        return set(), f"--changed-since {ref}: no implementation folder given"
    root = Path(_git(Path(args[0]).resolve(), "rev-parse", "--show-toplevel").strip()).resolve()
    files, gitlinks = changes(root, ref)
    everything = f"checking all {len(args)} implementations"
    trigger = next((f for f in files if is_global(f, spec_path, root)), None)
    if trigger is not None:
        return set(args), (f"--changed-since {ref}: {trigger} changed (validator, spec, toolchain or lock file): "
                           f"{everything}")
    if gitlinks:
        return set(args), (f"--changed-since {ref}: submodule or nested repository {sorted(gitlinks)[0]} changed "
                           f"(git does not say which of its files): {everything}")
    chosen, outside = set(), []
    for a in args:
        folder = Path(os.path.abspath(a))
        real = _inside(folder.resolve(), root)
        lexical = _inside(folder.parent.resolve() / folder.name, root)
        if real is None or lexical is None:
            chosen.add(a)
            outside.append(Path(a).name)
            continue
        if _touches(files, real) or _touches(files, lexical):
            chosen.add(a)
        for link in _links(folder):
            link_rel = _inside(link.parent.resolve() / link.name, root)
            target = _inside(link.resolve(), root)
            if link != folder and target is not None and (target == real or target.startswith(real + "/")):
                continue  # a link within the folder: a change there is the folder's own
            if target is None:
                chosen.add(a)
                outside.append(f"{Path(a).name} ({link.name})")
            elif (link_rel and _touches(files, link_rel)) or _touches(files, target):
                return set(args), (f"--changed-since {ref}: {target} changed, reached through the symbolic link "
                                   f"{link_rel or link} of {Path(a).name}: {everything}")
    names = ", ".join(sorted(Path(a).name for a in chosen)) or "none"
    note = (f"--changed-since {ref}: {len(files)} files changed; implementations changed: {names} "
            f"({len(args) - len(chosen)} unchanged, not checked)")
    if outside:
        note += f"; always checked, as they are or link outside this checkout: {', '.join(sorted(set(outside)))}"
    return chosen, note
