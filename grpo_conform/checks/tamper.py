"""`tamper-scan`: a static scan of an implementation's source for references to the validator's
internals. It runs in the parent on the folder's files as text and syntax trees: nothing of the
folder is imported or executed.

A tripwire, not a proof: a determined author can spell `ctypes` as `"ct" + "ypes"`; the scan
exists so that a plain attempt (patching the worker's evidence, reading the parent's memory,
rewriting sys.modules) fails with the offending lines instead of passing quietly, and so that a
reviewer sees why. What holds against hostile code is the process boundary (docs/checks.md).

Flagged in Python files (by the syntax tree, so comments and `if __name__ == "__main__":` do not
trip it):
- importing `grpo_conform`, `__main__`, `ctypes`/`_ctypes`, or the name in any string constant;
- `gc.get_objects`/`get_referrers`/`get_referents` (finding the worker's objects), frame walking
  (`sys._getframe`, `inspect.currentframe`/`stack`, `.f_back`, `.f_globals`, `.f_locals`);
- writes to `sys.modules` (item assignment or deletion, `update`, `pop`, `setdefault`, ...);
- strings naming `/proc/` paths or `ptrace`, and the names `ptrace`, `__main__` anywhere else.
Other text files of the folder are searched for `grpo_conform`, `/proc/` and `ptrace`.
A file that does not parse is scanned as text only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from grpo_conform.implementations import Implementation, MANIFEST
from grpo_conform.results import CheckOutcome

CHECK = "tamper-scan"
MODULES = {"grpo_conform": "the validator's package", "__main__": "the validator's main module",
           "ctypes": "raw memory and system calls", "_ctypes": "raw memory and system calls"}
STRINGS = {"grpo_conform": "the validator's package", "/proc/": "process internals (/proc)",
           "ptrace": "ptrace", "ctypes": "raw memory and system calls"}
ATTRIBUTES = {"get_objects": "gc.get_objects (finding the worker's objects)",
              "get_referrers": "gc.get_referrers", "get_referents": "gc.get_referents",
              "_getframe": "frame walking (sys._getframe)", "currentframe": "frame walking (inspect.currentframe)",
              "f_back": "frame walking (f_back)", "f_globals": "another frame's globals",
              "f_locals": "another frame's locals", "ptrace": "ptrace"}
MUTATORS = {"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__"}
TEXT_SUFFIXES = {".txt", ".json", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".c", ".cu", ".cpp", ".h", ".sh"}
MAX_FINDINGS = 50


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    what: str
    text: str

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "what": self.what, "text": self.text}


def _is_sys_modules(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "modules" and \
        isinstance(node.value, ast.Name) and node.value.id == "sys"


def _is_name_main_test(node: ast.Compare) -> bool:
    sides = [node.left, *node.comparators]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self._allowed_main: set[int] = set()

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append((getattr(node, "lineno", 0), what))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in MODULES:
                self.flag(node, f"imports {alias.name}: {MODULES[top]}")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        top = (node.module or "").split(".")[0]
        if node.level == 0 and top in MODULES:
            self.flag(node, f"imports from {node.module}: {MODULES[top]}")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if _is_name_main_test(node):
            for c in [node.left, *node.comparators]:
                if isinstance(c, ast.Constant) and c.value == "__main__":
                    self._allowed_main.add(id(c))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            for needle, what in STRINGS.items():
                if needle in (text.lower() if needle == "ptrace" else text):
                    self.flag(node, f"string mentions {needle!r}: {what}")
            if "__main__" in text and id(node) not in self._allowed_main:
                self.flag(node, "string mentions '__main__': the validator's main module")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("ptrace", "__main__"):
            self.flag(node, f"name {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ATTRIBUTES:
            self.flag(node, ATTRIBUTES[node.attr])
        if node.attr in MUTATORS and _is_sys_modules(node.value):
            self.flag(node, f"sys.modules.{node.attr}: rewrites the module table")
        self.generic_visit(node)

    def _targets(self, targets: list[ast.AST], node: ast.AST, verb: str) -> None:
        for t in targets:
            if isinstance(t, ast.Subscript) and _is_sys_modules(t.value):
                self.flag(node, f"{verb} sys.modules[...]: rewrites the module table")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node, "assigns")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets([node.target], node, "assigns")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._targets(node.targets, node, "deletes")
        self.generic_visit(node)


def scan_python(source: str) -> list[tuple[int, str]]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return scan_text(source)
    s = _Scanner()
    # Compare nodes first, so the `"__main__"` of `if __name__ == "__main__":` is known as allowed.
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            s.visit_Compare(node)
    s.visit(tree)
    return sorted(set(s.found))


def scan_text(text: str) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        for needle in ("grpo_conform", "/proc/", "ptrace"):
            if needle in line:
                out.append((i, f"mentions {needle!r}"))
    return out


def scan_folder(folder: Path) -> list[Finding]:
    findings: list[Finding] = []
    for p in sorted(folder.rglob("*"), key=lambda q: q.as_posix()):
        rel = p.relative_to(folder)
        if not p.is_file() or "__pycache__" in rel.parts or rel.as_posix() == MANIFEST:
            continue
        if p.suffix == ".py":
            text = p.read_text(encoding="utf-8", errors="replace")
            hits = scan_python(text)
        elif p.suffix in TEXT_SUFFIXES:
            text = p.read_text(encoding="utf-8", errors="replace")
            hits = scan_text(text)
        else:
            continue
        lines = text.splitlines()
        for line, what in hits:
            shown = lines[line - 1].strip()[:160] if 0 < line <= len(lines) else ""
            findings.append(Finding(rel.as_posix(), line, what, shown))
    return findings


@lru_cache(maxsize=64)
def _cached(path: str, identity: str) -> tuple[Finding, ...]:
    return tuple(scan_folder(Path(path)))


def tamper_scan(impl: Implementation) -> CheckOutcome:
    """The `tamper-scan` outcome of one implementation (the same on every workload)."""
    findings = _cached(str(impl.path), impl.identity)
    if not findings:
        return CheckOutcome(CHECK, "pass", "no reference to the validator's internals in the source",
                            {"scanned": "python syntax trees and text files of the folder"})
    first = findings[0]
    return CheckOutcome(CHECK, "fail",
                        f"{len(findings)} reference(s) to the validator's internals, first {first.file}:{first.line}: "
                        f"{first.what}: {first.text}",
                        {"findings": [f.to_json() for f in findings[:MAX_FINDINGS]], "count": len(findings),
                         "note": "a tripwire, not a proof (docs/checks.md)"})
