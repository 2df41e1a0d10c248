"""The `identities` step: recompute what a record names from the project it belongs to.

The project is the verifier's own checkout: an explicit `--project DIR`, else the nearest ancestor
of the current directory holding `.git` or `pyproject.toml`. Never a folder found from the record's
path: a `pyproject.toml` dropped next to records by the same pull request would otherwise decide
which files the identities are checked against (issue 29). Paths come
from the record, so they are confined: relative, no `..`, and the resolved path (symbolic links
followed) must stay inside the project, else nothing is read. When the tree differs and the
record names a commit, the identity is recomputed from that commit's objects (`git ls-tree` /
`git cat-file`, nothing is checked out) and the report says which it matched. What cannot be
recomputed is `unverified`, never a pass.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import rfc8785

from grpo_conform.implementations import ManifestError, folder_listing
from grpo_conform.spec import find_spec
from grpo_conform.spec.find import find_spec_in

Status = Literal["match", "match-commit", "differs", "unverified"]
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
MAX_SPEC_BYTES = 4 << 20


@dataclass(frozen=True)
class IdentityCheck:
    kind: Literal["record", "spec", "spec-file", "implementation"]
    name: str
    recorded: str
    recomputed: str | None
    status: Status
    source: str  # where it was recomputed from, or why it was not

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "recorded": self.recorded, "recomputed": self.recomputed,
                "status": self.status, "source": self.source}

    def describe(self) -> str:
        if self.status == "match":
            return f"{self.kind} {self.name}: matches {self.source}"
        if self.status == "match-commit":
            return f"{self.kind} {self.name}: matches {self.source}"
        if self.status == "differs":
            return (f"{self.kind} {self.name}: recorded {self.recorded}, recomputed {self.recomputed} "
                    f"({self.source})")
        return f"{self.kind} {self.name}: UNVERIFIED ({self.source})"


def safe_relative(path: Any) -> str | None:
    """Why `path` may not be resolved, or None when it is a plain relative path inside a project."""
    if not isinstance(path, str) or not path:
        return "not a non-empty string"
    if not _SAFE_PATH.match(path):
        return "only relative POSIX paths of [A-Za-z0-9._-] segments are allowed"
    if any(part in (".", "..") for part in PurePosixPath(path).parts):
        return "'.' and '..' segments are not allowed"
    return None


def project_root_for(record: Path | None, explicit: str | Path | None) -> Path | None:
    """The verifier's checkout: `explicit`, else the current directory's. `record` is not used to
    find it (kept in the signature so callers say what they verify)."""
    del record  # never: the record's folder is what the pull request supplies
    if explicit is not None:
        return Path(explicit).resolve()
    start = Path.cwd().resolve()
    for d in (start, *start.parents):
        if (d / ".git").exists() or (d / "pyproject.toml").is_file():
            return d
    return None


def tree_identity(root: Path | None, path: str) -> str | None:
    """The implementation identity of folder `path` in the project's tree now, or None."""
    if root is None or safe_relative(path):
        return None
    folder = _inside(root, path)
    if folder is None or not folder.is_dir():
        return None
    try:
        return hashlib.sha256(folder_listing(folder).encode()).hexdigest()
    except (ManifestError, OSError):
        return None


def _inside(root: Path, relative: str) -> Path | None:
    target = (root / relative).resolve()
    try:
        target.relative_to(root.resolve())
    except ValueError:
        return None  # a symbolic link inside the project pointing out of it
    return target


_OBJECTS: dict[tuple, bytes] = {}  # every call reads by full commit or object ids: a found answer is fixed


def _git(root: Path, *args: str, stdin: bytes | None = None) -> bytes | None:
    key = (str(root), args, stdin)  # records of one commit ask the same (a git process each: docs/timing.md)
    if key in _OBJECTS:
        return _OBJECTS[key]
    try:
        done = subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    _OBJECTS[key] = done.stdout
    return done.stdout


def _git_blobs(root: Path, commit: str, path: str) -> dict[str, bytes] | None:
    """{path relative to `path`: content} of the files under `path` at `commit`, or None."""
    listing = _git(root, "ls-tree", "-r", "-z", "--full-tree", commit, "--", path)
    if listing is None:
        return None
    entries = []
    for item in listing.split(b"\0"):
        if not item:
            continue
        meta, _, name = item.partition(b"\t")
        mode, kind, obj = meta.split(b" ")
        if kind != b"blob":
            continue
        if mode == b"120000":
            return None  # identities refuse symbolic links; so does this
        entries.append((name.decode("utf-8", "surrogateescape"), obj.decode()))
    if not entries:
        return None
    batch = _git(root, "cat-file", "--batch", stdin=b"".join(o.encode() + b"\n" for _, o in entries))
    if batch is None:
        return None
    out, pos = {}, 0
    for name, _obj in entries:
        header_end = batch.index(b"\n", pos)
        size = int(batch[pos:header_end].split(b" ")[2])
        out[name] = batch[header_end + 1:header_end + 1 + size]
        pos = header_end + 1 + size + 1
    return out


def _listing_hash(files: dict[str, bytes], prefix: str) -> str:
    lines = []
    for name in sorted(files, key=lambda n: n.encode()):
        rel = PurePosixPath(name).relative_to(prefix).as_posix()
        if "__pycache__" in PurePosixPath(rel).parts:
            continue
        lines.append(f"{hashlib.sha256(files[name]).hexdigest()}  {rel}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _commit_of(statement: dict[str, Any]) -> str | None:
    commit = statement["predicate"].get("software", {}).get("git_commit")
    return commit if isinstance(commit, str) and _COMMIT.match(commit) else None


def implementation_check(statement: dict[str, Any], root: Path | None) -> IdentityCheck:
    impl = statement["predicate"]["implementation"]
    name, recorded = impl["path"], impl["identity"]
    bad = safe_relative(name)
    if bad:
        return IdentityCheck("implementation", repr(name), recorded, None, "unverified", f"path refused: {bad}")
    if root is None:
        return IdentityCheck("implementation", name, recorded, None, "unverified",
                             "no project found (run inside the checkout, or pass --project DIR)")
    folder = _inside(root, name)
    here = None
    if folder is None:
        return IdentityCheck("implementation", name, recorded, None, "unverified",
                             f"{name} resolves outside {root}; not read")
    if folder.is_dir():
        try:
            here = hashlib.sha256(folder_listing(folder).encode()).hexdigest()
        except (ManifestError, OSError) as exc:
            here = None
            why = f"unreadable: {exc}"
        if here == recorded:
            return IdentityCheck("implementation", name, recorded, here, "match", f"the tree at {root}")
    commit = _commit_of(statement)
    if commit:
        files = _git_blobs(root, commit, name)
        if files is not None:
            at = _listing_hash(files, name)
            if at == recorded:
                changed = "the tree has changed since" if here is not None else "the tree no longer has it"
                return IdentityCheck("implementation", name, recorded, at, "match-commit",
                                     f"commit {commit[:7]} in {root}; {changed}")
            if here is None:
                return IdentityCheck("implementation", name, recorded, at, "differs", f"commit {commit[:7]}")
    if here is not None:
        return IdentityCheck("implementation", name, recorded, here, "differs", f"the tree at {root}"
                             + (f" (and commit {commit[:7]} is not in this repository)" if commit else ""))
    return IdentityCheck("implementation", name, recorded, None, "unverified",
                         why if folder.is_dir() else f"no folder {name} in {root}"
                         + (f" and commit {commit[:7]} not found there" if commit else ""))


def _spec_bytes(root: Path, uri: str, commit: str | None) -> tuple[bytes | None, str]:
    """The file in the tree (commit None) or at `commit`."""
    path = _inside(root, uri)
    if commit is None:
        if path is not None and path.is_file() and path.stat().st_size <= MAX_SPEC_BYTES:
            return path.read_bytes(), f"{uri} in {root}"
    else:
        data = _git(root, "show", f"{commit}:{uri}")
        if data is not None and len(data) <= MAX_SPEC_BYTES:
            return data, f"{uri} at commit {commit[:7]}"
    return None, f"no file {uri} in {root}"


def spec_checks(statement: dict[str, Any], root: Path | None, uri: str | None,
                file_sha256: str | None) -> list[IdentityCheck]:
    """The spec's canonical identity (whole-file documents) and, when recorded, its file's plain sha256."""
    spec = statement["predicate"]["spec"]
    name = f"{spec['id']}@{spec['version']}"
    if uri is None or safe_relative(uri) or root is None:
        why = "the record names no spec file" if uri is None else (
            f"uri refused: {safe_relative(uri)}" if safe_relative(uri) else "no project found")
        return [IdentityCheck("spec", name, spec["identity"], None, "unverified", why)]
    commit = _commit_of(statement)
    sources = [(*_spec_bytes(root, uri, None), "match")]
    if commit:
        sources.append((*_spec_bytes(root, uri, commit), "match-commit"))
    first: list[IdentityCheck] | None = None
    for data, where, status in sources:
        if data is None:
            continue
        if status == "match-commit":
            where += "; the tree has changed since" if sources[0][0] is not None else "; the tree no longer has it"
        checks, ok = _spec_against(spec, name, uri, file_sha256, data, where, status)
        if ok:
            claim = _shipped_name_problem(root, uri, spec, None if status == "match" else commit)
            if claim:
                checks.append(IdentityCheck("spec", name, spec["identity"], None, "differs", claim))
                ok = False
        if ok and spec.get("member") is not None:
            # at a commit too: a record relabelled as another member must not pass because the tree moved on
            checks.append(_member_identity(spec, name, root, where, None if status == "match" else (uri, data)))
            ok = checks[-1].status == "match"
            if ok and status == "match-commit":
                checks[-1] = IdentityCheck(**{**checks[-1].__dict__, "status": "match-commit"})
        if ok:
            return checks
        first = first or checks
    if first:
        return first
    tried = f"no file {uri} in {root}" + (f" or at commit {commit[:7]}" if commit else "")
    return [IdentityCheck("spec", name, spec["identity"], None, "unverified", tried)]


SHIPPED_SPECS = "specs"  # where a project keeps the specs it ships; an id@version found there names that file


def _shipped_name_problem(root: Path, uri: str, spec: dict[str, Any], commit: str | None) -> str | None:
    """Why the spec file a record names cannot stand for its id: another file of the project's `specs/` (in
    the tree, or at the record's commit) ships that id and version, or the commit is not in the checkout's
    history. Adversarial round 2026-12-05: a copy of grpo-token-is.v1.json with its tolerances loosened 1000x,
    kept elsewhere in the project, verified as "grpo-token-is 1.0.0" under `--spec grpo-token-is`."""
    if commit is not None and _git(root, "merge-base", "--is-ancestor", commit, "HEAD") is None:
        return (f"commit {commit[:7]} is not in the history of {root}'s HEAD: a spec from a commit this checkout "
                "never had (a branch not merged) does not name a spec of this project")
    family = str(spec["id"]).split("/", 1)[0] if spec.get("member") is not None else str(spec["id"])
    shipped = _shipped_files(root, commit).get((family, str(spec["version"])))
    if shipped is not None and shipped != uri:
        return (f"{uri} claims {family}@{spec['version']}, which this project ships as {shipped}"
                + (f" at commit {commit[:7]}" if commit else "") + ": a spec under a shipped name is not that spec")
    return None


_SHIPPED: dict[tuple, dict[tuple[str, str], str]] = {}  # records of one commit (or tree) ask the same


def _shipped_files(root: Path, commit: str | None) -> dict[tuple[str, str], str]:
    """(id, version) -> path of each spec file under `specs/`, in the tree or at `commit`; read and parsed once
    per commit, and per state of the tree's files (names, sizes, mtimes)."""
    folder = root / SHIPPED_SPECS
    found = sorted(f for f in folder.glob("*.json") if f.is_file()) if commit is None and folder.is_dir() else []
    key = (str(root), commit) if commit is not None else (
        str(root), tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in found))
    if key not in _SHIPPED:
        _SHIPPED[key] = _parse_shipped(
            {f"{SHIPPED_SPECS}/{f.name}": f.read_bytes() for f in found if f.stat().st_size <= MAX_SPEC_BYTES}
            if commit is None else _git_blobs(root, commit, SHIPPED_SPECS) or {})
    return _SHIPPED[key]


def _parse_shipped(files: dict[str, bytes]) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for path, data in sorted(files.items()):
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        if isinstance(doc, dict) and PurePosixPath(path).parent.as_posix() == SHIPPED_SPECS:
            out.setdefault((str(doc.get("id")), str(doc.get("version"))), path)
    return out


def _member_identity(spec: dict[str, Any], name: str, root: Path, where: str,
                     at_commit: tuple[str, bytes] | None = None) -> IdentityCheck:
    """A member's identity is that of its resolved document: resolved by the spec module from the
    project's specs/, or from the family file as the record's commit has it (the file's sha256
    already matched, so this checks the record's claim about which member it is)."""
    try:
        if at_commit is None:
            identity = find_spec_in(name, root / "specs").identity  # once per state of specs/
        else:
            identity = _identity_at_commit(name, PurePosixPath(at_commit[0]).name, at_commit[1])
    except Exception as exc:  # noqa: BLE001 - any failure to resolve means "not recomputed", said plainly
        return IdentityCheck("spec", name, spec["identity"], None, "unverified", f"cannot resolve {name}: {exc}")
    status: Status = "match" if identity == spec["identity"] else "differs"
    return IdentityCheck("spec", name, spec["identity"], identity, status, f"{name} resolved from {where}")


_AT_COMMIT: dict[tuple[str, str, str], str] = {}


def _identity_at_commit(name: str, file_name: str, data: bytes) -> str:
    """Member `name`'s identity resolved from a family file's bytes at a commit, once per (content, file
    name, member): each record's copy lands in a temporary directory of its own, so the spec module's
    cache (by path and mtime) missed and every record re-validated the family (docs/timing.md)."""
    key = (hashlib.sha256(data).hexdigest(), file_name, name)
    if key not in _AT_COMMIT:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / file_name).write_bytes(data)
            _AT_COMMIT[key] = find_spec(name, dirs=[Path(tmp)]).identity
    return _AT_COMMIT[key]


def _spec_against(spec: dict[str, Any], name: str, uri: str, file_sha256: str | None, data: bytes, where: str,
                  status: Status) -> tuple[list[IdentityCheck], bool]:
    digest = hashlib.sha256(data).hexdigest()
    checks, ok = [], True
    if file_sha256 is not None:
        good = digest == file_sha256
        ok &= good
        checks.append(IdentityCheck("spec-file", uri, file_sha256, digest, status if good else "differs", where))
    if spec.get("member") is None:  # a whole-file spec: its identity is the file's canonical form
        try:  # only here: a member's identity is its resolved document's (spec_checks)
            canonical: str | None = hashlib.sha256(rfc8785.dumps(json.loads(data))).hexdigest()
        except (ValueError, rfc8785.CanonicalizationError, RecursionError):
            canonical = None
        good = canonical == spec["identity"]
        ok &= good
        checks.append(IdentityCheck("spec", name, spec["identity"], canonical, status if good else "differs", where))
    elif file_sha256 is None:
        ok = False
        checks.append(IdentityCheck("spec", name, spec["identity"], None, "unverified",
                                    "a member spec is bound through its file's sha256, which this record lacks"))
    return checks, ok

