"""`assert_conforms`, for kernel authors' own pytest suites, in the manner of
`torch.testing.assert_close`: returns None when the implementation conforms, raises an
AssertionError carrying the evidence (summary line, first failure in full) when it does not.

    from grpo_conform.testing import assert_conforms

    def test_my_kernel_conforms():
        assert_conforms("my_kernels.grpo:grpo_loss", device="cpu", workloads=["odd-vocab"])

`fn_or_path` is one of
- a folder with an implementation.toml (exactly what `grpo-conform check` takes);
- "module:callable" or "path/to/file.py:callable";
- the callable itself (a plain function defined at module level).
Every form runs isolated the same way as `check`: the function is loaded and called in a worker
process, never in the test's own process (so it cannot see or patch the validator). For the last
two forms an implementation folder is written to a temporary directory: the local source (the one
file, or the whole top-level package) is copied into it, since the worker sees only its folder and
installed packages; an installed module is imported by a one-line shim. A copied package must
import its own modules relatively (`from . import kernels`), as any implementation folder does.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from grpo_conform.gate.plan import SelectionError, member_matches, specs_of
from grpo_conform.implementations import load_implementation
from grpo_conform.report.failures import failure_lines, workloads_of

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def _installed(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def _manifest(folder: Path, name: str, entry: str, spec: str, devices: list[str], what: str) -> None:
    safe = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:60] or "under-test"
    devs = ", ".join(f'"{d}"' for d in devices)
    (folder / "implementation.toml").write_text(
        f'name = "{safe}"\nspec = "{spec}"\nentry = "{entry}"\nlanguage = "python"\n'
        f'license = "NOASSERTION"\ndevices = [{devs}]\ndescription = "{what} under assert_conforms"\n')


def _folder_for(module: str, attr: str, file: Path | None, spec: str, devices: list[str], folder: Path) -> Path:
    """An implementation folder the worker can load: the worker sees only that folder (and installed
    packages), so local source is copied into it; an installed module is imported by a one-line shim."""
    what = f"{module}:{attr}"
    if file is not None:  # a single local file: copied as it is
        shutil.copy2(file, folder / f"{module}.py")
        _manifest(folder, f"{module}-{attr}", f"{module}:{attr}", spec, devices, what)
        return folder
    top = module.split(".")[0]
    found = importlib.util.find_spec(top)
    if found is None or found.origin in (None, "built-in", "frozen"):
        raise ModuleNotFoundError(f"assert_conforms: cannot find module {top!r} (is it importable here?)")
    origin = Path(found.origin)
    if _installed(origin):
        line = f"from {module} import {attr} as grpo_loss  # noqa: F401"
    elif found.submodule_search_locations:  # a local package: copied, imported relatively from the shim
        shutil.copytree(origin.parent, folder / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        line = f"from .{module} import {attr} as grpo_loss  # noqa: F401"
    else:  # a local single-file module
        shutil.copy2(origin, folder / origin.name)
        line = f"from .{module} import {attr} as grpo_loss  # noqa: F401"
    (folder / "shim.py").write_text('"""Written by grpo_conform.testing.assert_conforms."""\n' + line + "\n")
    _manifest(folder, f"{module}-{attr}", "shim:grpo_loss", spec, devices, what)
    return folder


def _target(target: str | Callable[..., Any]) -> tuple[str, str, Path | None]:
    """(module, attribute, single file to copy or None) for a callable, 'file.py:callable' or 'module:callable'."""
    if callable(target):
        module, attr = target.__module__, target.__qualname__
        if "<" in attr or "." in attr:
            raise TypeError(f"assert_conforms: {attr!r} is not a module-level function; define it at module level or "
                            "pass 'module:callable' or an implementation folder")
        if module == "__main__":
            raise TypeError("assert_conforms: cannot load a function defined in __main__; pass 'file.py:callable'")
        source = inspect.getsourcefile(target)
        if "." not in module and source is not None and not _installed(Path(source)):
            return module, attr, Path(source)
        return module, attr, None
    text = str(target)
    mod, _, attr = text.rpartition(":")
    if mod.endswith(".py"):
        path = Path(mod)
        if not path.is_file():
            raise FileNotFoundError(f"assert_conforms: {mod}: no such file")
        return path.stem, attr, path
    if not (_IDENT.match(mod) and _IDENT.match(attr)):
        raise ValueError(f"assert_conforms: {text!r}: expected an implementation folder, 'module:callable', "
                         "'file.py:callable' or a callable")
    return mod, attr, None


def members_to_check(folder: str | Path, spec_path: str | None, workloads: tuple[str, ...],
                     members: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The members `assert_conforms` checks: every one the manifest declares (or those of `members`).

    With `workloads`, each named workload runs on the members it applies to; a named workload that
    applies to none of them, or a member that none applies to, is a SelectionError: `check` would
    silently leave such a member out, and the assertion would pass having checked fewer members than
    declared (issue 28: `workloads=["odd-vocab"]` dropped the ten masked members of a folder)."""
    impl = load_implementation(folder)
    specs = [s for s in specs_of(impl, spec_path, {}) if not members or any(member_matches(s, m) for m in members)]
    labels = tuple(s.member or s.id for s in specs)
    if not workloads:
        return labels
    applies = {label: [w for w in workloads if any(x.name == w for x in s.workloads)]
               for label, s in zip(labels, specs)}
    unused = [w for w in workloads if not any(w in ws for ws in applies.values())]
    if unused:
        raise SelectionError(f"assert_conforms: workload {unused[0]!r} applies to no member {impl.name} declares "
                             f"({', '.join(labels)}); each member's workloads: `grpo-conform spec show` on its spec")
    bare = [label for label, ws in applies.items() if not ws]
    if bare:
        spec = specs[labels.index(bare[0])]
        example = next((w for w in spec.workloads if w.tier == "standard" and "cpu" in w.devices), spec.workloads[0])
        raise SelectionError(
            f"assert_conforms: none of the workloads {list(workloads)} applies to member(s) {', '.join(bare)} of "
            f"{impl.name}, so they would go unchecked; name a workload of theirs too (e.g. "
            f"{example.name!r} of {bare[0]}: {', '.join(w.name for w in spec.workloads)}), or pass "
            f"members=[...] to check fewer members on purpose")
    return labels


def assert_conforms(fn_or_path: str | Path | Callable[..., Any], spec: str = "grpo-token-is", device: str = "cpu",
                    workloads: Iterable[str] = (), members: Iterable[str] = (), timing: bool = False,
                    timeout: float | None = None) -> None:
    """Run the conformance checks on `fn_or_path`; AssertionError with the evidence unless it conforms.

    `spec`: a spec id (as in a manifest) or, for a folder, a spec file overriding the manifest's;
    `device`: "cpu", "cuda" or "auto"; `workloads`: run only these (all of the spec's for the device by
    default), each on every declared member it applies to: every member checked must get one of them
    (else a `SelectionError` says which members would go unchecked); `members`: check only these,
    on purpose; `timing`: also time the protocols (CUDA only; off by default in unit tests)."""
    from grpo_conform.check import check_paths as check  # the engine (torch) only when a check runs

    path = Path(str(fn_or_path)) if isinstance(fn_or_path, (str, Path)) else None
    with tempfile.TemporaryDirectory(prefix="grpo-conform-assert-") as tmp:
        spec_path = None
        if path is not None and path.is_dir():
            folder = path
            spec_path = spec if spec.endswith(".json") else None
        else:
            module, attr, file = _target(fn_or_path if path is None else str(fn_or_path))
            devices = ["cpu", "cuda"] if device == "auto" else [device]
            folder = _folder_for(module, attr, file, spec, devices, Path(tmp))
        workloads, members = tuple(workloads), tuple(members)
        expected = members_to_check(folder, spec_path, workloads, members)
        report = check(str(folder), device=device, workloads=workloads, members=members, spec=spec_path,
                       timing=timing, timeout=timeout)
    (impl,) = report.implementations
    checked = {m.member for m in impl.members}
    if impl.status == "conformant" and not set(expected) <= checked:  # never a pass on fewer members than asked
        raise AssertionError(f"{impl.name}: checked {len(checked)} of the {len(expected)} members it declares "
                             f"(not checked: {', '.join(m for m in expected if m not in checked)})")
    if impl.status == "conformant":
        return None
    lines = failure_lines(impl) if workloads_of(impl) else [f"{impl.name} {impl.status.upper()}: {impl.message}"]
    raise AssertionError("\n".join(lines))
