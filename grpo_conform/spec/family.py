"""Spec families (docs/spec-family.md): one file of `common` fields plus `members`, each member
resolved into a full format-2 spec document by one rule, and identified by the sha256 of the
RFC 8785 form of that resolved document.

Resolution: start from `common`; every top-level field the member gives replaces the common one;
`inputs` and `parameters` keep only what the member names (a parameter entry may override the
common parameter's `value`, `domain`, `draw` or `description`); `layouts` keeps the member's
inputs only. The result carries `format: grpo-conform-spec/2`, `id: "<family>/<member>"`, the
family's version and `family: {id, version, member}`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_conform.spec.documents import read_document, spec_dirs, spec_from_document, validate_document
from grpo_conform.spec.model import FAMILY_FORMAT, MEMBER_FORMAT, Spec, SpecError

_NOT_COPIED = ("name", "inputs", "parameters")


@dataclass(frozen=True)
class Family:
    path: Path
    doc: dict[str, Any]

    @property
    def id(self) -> str:
        return self.doc["id"]

    @property
    def version(self) -> str:
        return self.doc["version"]

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m["name"] for m in self.doc["members"])

    def resolved(self, member: str) -> dict[str, Any]:
        return resolve_member_document(self.doc, member, self.path)

    def member(self, name: str) -> Spec:
        key = (_file_key(self.path), name)
        if key not in _MEMBERS:  # resolved specs are frozen: loading one once per file version is enough
            try:
                spec = spec_from_document(self.resolved(name), f"{self.path} (member {name})")
            except SpecError as exc:
                raise SpecError(exc.file, exc.path, exc.problem) from None
            spec._source = str(self.path)  # source: the family file itself
            _MEMBERS[key] = spec
        return _MEMBERS[key]

    def members(self) -> tuple[Spec, ...]:
        return tuple(self.member(n) for n in self.member_names)


def is_family_document(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("format") == FAMILY_FORMAT


_FAMILIES: dict[tuple, "Family"] = {}
_MEMBERS: dict[tuple, Spec] = {}


def _file_key(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return (str(path),)
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


def load_family(path: str | Path) -> Family:
    """Read a family file and check it against the schema (members are checked when resolved).
    Cached per (file, mtime, size): validation costs a few tenths of a second."""
    path = Path(path)
    key = _file_key(path)
    if key in _FAMILIES:
        return _FAMILIES[key]
    doc = read_document(path)
    if not is_family_document(doc):
        raise SpecError(path, "$.format", f"expected a spec family (format {FAMILY_FORMAT!r})")
    validate_document(doc, path)
    names = [m["name"] for m in doc["members"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(path, f"$.members[{i}].name", f"duplicate member {name!r}")
    family = Family(path, doc)
    _FAMILIES[key] = family
    return family


def resolve_member_document(doc: dict[str, Any], member: str, file: str | Path) -> dict[str, Any]:
    """The resolved format-2 document of one member (what `spec show --member NAME --resolved` prints)."""
    names = [m["name"] for m in doc["members"]]
    if member not in names:
        raise SpecError(file, "$.members", f"no member {member!r}; members: {', '.join(names)}")
    index = names.index(member)
    m = doc["members"][index]
    common = doc["common"]
    out: dict[str, Any] = {}
    if "$schema" in doc:
        out["$schema"] = doc["$schema"]
    out.update({"format": MEMBER_FORMAT, "id": f"{doc['id']}/{member}", "version": doc["version"],
                "family": {"id": doc["id"], "version": doc["version"], "member": member}})
    out["title"], out["summary"] = doc["title"], doc.get("summary", "")
    for key, value in common.items():
        if key not in _NOT_COPIED:
            out[key] = copy.deepcopy(value)
    for key, value in m.items():
        if key not in _NOT_COPIED:
            out[key] = copy.deepcopy(value)
    by_name = {t["name"]: t for t in common.get("inputs", [])}
    out["inputs"] = []
    for j, name in enumerate(m["inputs"]):
        if name not in by_name:
            raise SpecError(file, f"$.members[{index}].inputs[{j}]", f"unknown input {name!r}; common inputs: {sorted(by_name)}")
        out["inputs"].append(copy.deepcopy(by_name[name]))
    params = {p["name"]: p for p in common.get("parameters", [])}
    out["parameters"] = []
    for j, entry in enumerate(m["parameters"]):
        override = {"name": entry} if isinstance(entry, str) else entry
        base = params.get(override["name"])
        if base is None:
            raise SpecError(file, f"$.members[{index}].parameters[{j}]",
                            f"unknown parameter {override['name']!r}; common parameters: {sorted(params)}")
        out["parameters"].append({**copy.deepcopy(base), **copy.deepcopy(override)})
    kept = set(m["inputs"])
    out["layouts"] = {k: v for k, v in out.get("layouts", {}).items() if k in kept}
    return out


def load_member(path: str | Path, member: str) -> Spec:
    return load_family(path).member(member)


def families(dirs: list[Path] | None = None) -> list[Family]:
    """Every family file in the spec directories (unreadable files are skipped, as find_spec does)."""
    out: list[Family] = []
    for d in spec_dirs() if dirs is None else dirs:
        for file in sorted(d.glob("*.json")):
            try:
                doc = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if is_family_document(doc):
                out.append(load_family(file))
    return out


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def find_family(family_id: str, version: str | None = None, dirs: list[Path] | None = None) -> Family | None:
    found = [f for f in families(dirs) if f.id == family_id and (version is None or f.version == version)]
    return max(found, key=lambda f: _version_key(f.version)) if found else None


def alias_member(reference_id: str, dirs: list[Path] | None = None) -> Spec | None:
    """An unversioned `F-M` (e.g. `grpo-token-is`) names member M of family F when that family has it."""
    for fam in sorted(families(dirs), key=lambda f: _version_key(f.version), reverse=True):
        prefix = fam.id + "-"
        if reference_id.startswith(prefix) and reference_id[len(prefix):] in fam.member_names:
            return fam.member(reference_id[len(prefix):])
    return None
