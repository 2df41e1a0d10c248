"""Finding specs by reference: `find_spec` (an id, `id@version`, `family/member`, an alias such as
`grpo-token-is`) and `specs_for_manifest` (the specs an implementation's manifest claims)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo_conform.implementations import MANIFEST, ManifestError
from grpo_conform.spec.documents import load_spec, read_document, spec_dirs
from grpo_conform.spec.family import Family, alias_member, find_family, is_family_document, load_family
from grpo_conform.spec.model import ENV_SPEC_DIRS, FAMILY_FORMAT, Spec, SpecError

_ID_VERSION = re.compile(r"^(?P<id>[a-z0-9][a-z0-9-]*)(/(?P<member>[a-z0-9][a-z0-9-]*))?(@(?P<version>[0-9]+(\.[0-9]+)*))?$")


def find_spec(reference: str, dirs: list[Path] | None = None) -> Spec:
    """Find a spec among the spec directories (highest version wins). `id` or `id@version` names a
    standalone file; `family/member` or `family/member@version` a family member; an unversioned
    `family-member` (e.g. `grpo-token-is`) the family member when the family has it (decision spec-alias),
    else the standalone file of that id."""
    m = _ID_VERSION.match(reference)
    if not m:
        raise SpecError(reference, "$", "expected a spec id such as 'grpo-token-is', 'grpo-token-is@1.0.0' or 'grpo/token-is'")
    dirs = spec_dirs() if dirs is None else dirs
    where = ", ".join(str(d) for d in dirs) or "(no spec directory found)"
    if m["member"] is not None:
        fam = find_family(m["id"], m["version"], dirs)
        if fam is None:
            raise SpecError(reference, "$", f"no spec family {m['id']!r}{' version ' + m['version'] if m['version'] else ''} in {where}")
        return fam.member(m["member"])
    if m["version"] is None:
        member = alias_member(m["id"], dirs)
        if member is not None:
            return member
        fam = find_family(m["id"], None, dirs)
        if fam is not None:
            raise SpecError(reference, "$", f"{m['id']!r} is a spec family: name a member ('{m['id']}/NAME'; "
                            f"members: {', '.join(fam.member_names)})")
    found: list[Spec] = []
    for d in dirs:
        for file in sorted(d.glob("*.json")):
            try:
                doc = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(doc, dict) and doc.get("id") == m["id"] and doc.get("format") != FAMILY_FORMAT:
                if m["version"] is None or doc.get("version") == m["version"]:
                    found.append(load_spec(file))
    if not found:
        raise SpecError(
            reference, "$", f"no spec with this id in {where}; pass --spec FILE or set {ENV_SPEC_DIRS}"
        )
    return max(found, key=lambda s: tuple(int(x) for x in s.version.split(".")))



def _folder_state(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """What a cache key needs to notice an edited, added or removed spec file: (name, size, mtime) of each."""
    try:
        return tuple(sorted((f.name, st.st_size, st.st_mtime_ns) for f in folder.glob("*.json") for st in (f.stat(),)))
    except OSError:
        return ()


def find_spec_in(reference: str, folder: Path) -> Spec:
    """`find_spec(reference, dirs=[folder])`, resolved once per state of the folder's files: verifying hundreds
    of records of one project resolved the same few members again for each (~1.5 ms a record)."""
    return _find_in(reference, str(folder), _folder_state(folder))


@lru_cache(maxsize=256)
def _find_in(reference: str, folder: str, _state: tuple) -> Spec:
    return find_spec(reference, dirs=[Path(folder)])


def specs_for_manifest(manifest: Any, spec_path: str | Path | None = None, dirs: list[Path] | None = None) -> tuple[Spec, ...]:
    """The specs an implementation claims (decision manifest-members): `spec = "grpo"` + `members = [...]` gives one
    resolved member each, in the manifest's order; a standalone spec (or an alias such as
    `grpo-token-is`) gives one. `spec_path` (`--spec FILE`) replaces the manifest's spec reference.
    Accepts a `Manifest` or an `Implementation` (whose manifest file then names the errors)."""
    impl_path = getattr(manifest, "path", None)
    manifest = getattr(manifest, "manifest", manifest)
    file = Path(impl_path) / MANIFEST if impl_path is not None else Path(MANIFEST)
    members = tuple(manifest.members)
    fam: Family | None = None
    if spec_path is not None:
        doc = read_document(spec_path)
        if is_family_document(doc):
            fam = load_family(spec_path)
        elif members:
            raise ManifestError(file, "members", f"--spec {spec_path} is a standalone spec: it has no members")
        else:
            return (load_spec(spec_path),)
    else:
        ref = manifest.spec
        base = ref.split("@")[0]
        version = ref.split("@")[1] if "@" in ref else None
        if "/" not in base:
            fam = find_family(base, version, dirs)
        if fam is None:
            if members:
                try:
                    find_spec(ref, dirs)
                except SpecError as exc:  # no spec of that id at all: say where we looked, not "drop members"
                    raise ManifestError(file, "spec", f"no spec family {base!r} found: {exc.problem}") from None
                raise ManifestError(file, "members", f"spec {ref!r} is not a spec family: drop 'members' "
                                    "(it lists the members of a family such as spec = \"grpo\")")
            return (find_spec(ref, dirs),)
    if not members:
        raise ManifestError(file, "members", f"spec {fam.id!r} is a family: list the members you implement, e.g. "
                            f"members = [\"{fam.member_names[0]}\"] (members: {', '.join(fam.member_names)})")
    unknown = [m for m in members if m not in fam.member_names]
    if unknown:
        raise ManifestError(file, "members", f"unknown member {unknown[0]!r} of family {fam.id!r} "
                            f"(members: {', '.join(fam.member_names)})")
    return tuple(fam.member(m) for m in members)


def known_spec_ids(dirs: list[Path] | None = None) -> list[str]:
    """Every spec id the spec directories hold: family ids, their `family/member` ids, standalone ids."""
    ids: set[str] = set()
    for d in spec_dirs() if dirs is None else dirs:
        for file in sorted(d.glob("*.json")):
            try:
                doc = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
                continue
            ids.add(doc["id"])
            if is_family_document(doc):
                ids |= {f"{doc['id']}/{m.get('name')}" for m in doc.get("members") or () if isinstance(m, dict)}
    return sorted(ids)


def resolve_spec_option(ref: str, dirs: list[Path] | None = None) -> str | Spec:
    """What `check --spec REF` names (issue 31: only a file path worked): a path to an existing file, or
    anything ending in .json, is returned as given (a missing file keeps its file-not-found error); a
    family id (`grpo-fused-linear`, `grpo@1.0.0`) gives that family's file, so the manifest's members or
    `--member` pick from it as with `--spec FILE`; a member or standalone id (`grpo-fused-linear/token-is`,
    `grpo-token-is`) gives that one spec. An unknown id raises SpecError naming the known ids."""
    if Path(ref).is_file() or ref.endswith(".json") or not _ID_VERSION.match(ref):
        return ref
    m = _ID_VERSION.match(ref)
    assert m is not None
    if m["member"] is None:
        fam = find_family(m["id"], m["version"], dirs)
        if fam is not None:
            return str(fam.path)
    try:
        return find_spec(ref, dirs)
    except SpecError as exc:
        known = known_spec_ids(dirs)
        raise SpecError(ref, "$", f"--spec {ref!r} is neither a file nor a known spec id ({exc.problem}); known ids: "
                        f"{', '.join(known) or 'none'}") from None
