"""Implementation folders: `implementation.toml` plus Python source, and their identity.

The manifest keys are a contract (README, "Adding an implementation"):

    name = "pytorch"            # unique, lowercase, digits and dashes
    spec = "grpo-token-is"      # which spec it implements (id, or id@version)
    entry = "impl:grpo_loss"    # module (a .py file in this folder) : callable
    language = "python"         # python, triton, cuda, ...
    license = "BSD-3-Clause"    # SPDX id
    devices = ["cpu", "cuda"]
    description = "one line"
    # source = "https://..."    optional
    # requires = ["liger_kernel"]  optional: top-level modules that must be installed, else the
    #                              folder is skipped (found without importing anything)

Identity: sha256 of a `sha256sum`-style listing of every file in the folder (paths relative to
it, sorted bytewise, `__pycache__` left out), reproducible with coreutils:

    cd FOLDER && find . -type f ! -path '*/__pycache__/*' -printf '%P\\n' | LC_ALL=C sort \\
        | xargs -d '\\n' sha256sum | sha256sum
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from grpo_conform.errors import GrpoConformError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MANIFEST = "implementation.toml"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BYTECODE = (".pyc", ".pyo")
_SPDX = re.compile(r"^[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*$")


class ManifestError(GrpoConformError):
    """An implementation folder that breaks the contract; names the file and the field."""

    def __init__(self, file: str | Path, field: str | None, problem: str):
        self.file, self.field, self.problem = str(file), field, problem
        where = f"{file}: field '{field}'" if field else f"{file}"
        super().__init__(f"{where}: {problem}")


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    spec: str
    entry: str
    language: str
    license: str
    devices: tuple[Literal["cpu", "cuda"], ...]
    description: str
    source: Optional[str] = None
    requires: tuple[str, ...] = ()
    # The family members claimed (spec = "grpo"); required when `spec` names a family, checked by
    # grpo_conform.spec.find.specs_for_manifest, which knows the specs (docs/spec-family.md).
    members: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("expected lowercase letters, digits and dashes, starting with a letter or digit")
        return v

    @field_validator("entry")
    @classmethod
    def _entry(cls, v: str) -> str:
        if not _ENTRY.match(v):
            raise ValueError("expected 'module:callable', e.g. 'impl:grpo_loss'")
        return v

    @field_validator("license")
    @classmethod
    def _license(cls, v: str) -> str:
        if not _SPDX.match(v):
            raise ValueError("expected an SPDX license id such as 'BSD-3-Clause'")
        return v

    @field_validator("requires")
    @classmethod
    def _requires(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for r in v:
            if not _MODULE.match(r):
                raise ValueError(f"{r!r}: expected a top-level module name such as 'liger_kernel' (no dots: "
                                 "requirements are resolved without importing anything)")
        return v

    @field_validator("members")
    @classmethod
    def _members(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for m in v:
            if not _NAME.match(m):
                raise ValueError(f"member {m!r}: expected lowercase letters, digits and dashes")
        if len(set(v)) != len(v):
            raise ValueError("a member is listed twice")
        return v

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("expected at least one of 'cpu', 'cuda'")
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if not v.strip() or "\n" in v:
            raise ValueError("expected one non-empty line")
        return v

    @property
    def module(self) -> str:
        return self.entry.split(":")[0]

    @property
    def callable(self) -> str:
        return self.entry.split(":")[1]


@dataclass(frozen=True)
class Implementation:
    path: Path
    manifest: Manifest
    listing: str

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def identity(self) -> str:
        return hashlib.sha256(self.listing.encode()).hexdigest()

    def missing_requirements(self) -> list[str]:
        """The `requires` modules this interpreter cannot import, found without importing anything:
        a top-level name is looked up by the path finder on sys.path (no package `__init__` runs),
        leaving out every directory inside the implementation folder and the current directory's
        entry, so the folder can neither satisfy its own requirement nor run code in the parent."""
        folder = str(self.path)
        roots = [p for p in sys.path if p and os.path.abspath(p) != folder
                 and not os.path.abspath(p).startswith(folder + os.sep)]
        missing = []
        for name in self.manifest.requires:
            if name in sys.builtin_module_names:
                continue
            if importlib.machinery.PathFinder.find_spec(name, roots) is None:
                missing.append(name)
        return missing

    @property
    def module_file(self) -> Path:
        return self.path.joinpath(*self.manifest.module.split(".")).with_suffix(".py")


def check_loadable_files(folder: Path) -> None:
    """What the worker could load must be what the identity covers: `__pycache__` (left out of the
    identity; never copied to the worker, which compiles source only) may hold bytecode and nothing
    else, and bytecode outside it (which a reviewer cannot read) is refused."""
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_file():
            continue
        in_cache = "__pycache__" in rel.parts
        if in_cache and p.suffix not in _BYTECODE:
            raise ManifestError(p, None, "__pycache__ may hold only bytecode (.pyc), which is never loaded; "
                                "a native library or other file there is outside the identity: move it out "
                                "of __pycache__ (then it is covered) or delete it")
        if not in_cache and p.suffix in _BYTECODE:
            raise ManifestError(p, None, "bytecode outside __pycache__ is not loaded: ship the .py source instead")


def folder_listing(folder: Path) -> str:
    """`sha256sum`-style listing of the folder's files: '<hex>  <relative path>' per line."""
    files = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if "__pycache__" in rel.parts or not p.is_file() or p.is_symlink():
            if p.is_symlink():
                raise ManifestError(p, None, "symbolic links are not allowed in an implementation folder")
            continue
        name = rel.as_posix()
        if "\n" in name or "\\" in name:
            raise ManifestError(p, None, "file names with newlines or backslashes are not allowed")
        files.append(name)
    lines = []
    for name in sorted(files, key=lambda n: n.encode()):
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        lines.append(f"{digest}  {name}\n")
    return "".join(lines)


def load_implementation(path: str | Path) -> Implementation:
    """Read and check an implementation folder without importing it (importing happens in a worker)."""
    folder = Path(path)
    if not folder.exists():
        raise ManifestError(folder, None, "no such folder")
    if folder.is_file() and folder.name == MANIFEST:
        folder = folder.parent
    if not folder.is_dir():
        raise ManifestError(folder, None, f"expected a folder holding {MANIFEST}")
    file = folder / MANIFEST
    if not file.is_file():
        raise ManifestError(file, None, f"missing: every implementation folder needs {MANIFEST} (see README)")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(file, None, f"not valid TOML: {exc}") from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        problem = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            problem = "missing required field"
        elif err["type"] == "extra_forbidden":
            problem = "unknown field (allowed: " + ", ".join(Manifest.model_fields) + ")"
        raise ManifestError(file, field, problem) from None
    check_loadable_files(folder)
    impl = Implementation(folder.resolve(), manifest, folder_listing(folder))
    if not impl.module_file.is_file():
        raise ManifestError(file, "entry", f"module {manifest.module!r} not found: expected {impl.module_file}")
    return impl
