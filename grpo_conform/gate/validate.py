"""`grpo-conform manifest validate PATH...` (the pre-commit hook's manifest half): every
implementation folder or implementation.toml named is loaded as `check` would load it (manifest
fields, entry file, identity) and its spec members resolved. Every path is reported, not only
the first bad one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_conform.errors import EXIT_OK, EXIT_USAGE, GrpoConformError
from grpo_conform.gate.plan import specs_of
from grpo_conform.implementations import load_implementation


@dataclass(frozen=True)
class ValidateRequest:
    paths: tuple[str, ...]


@dataclass(frozen=True)
class ValidateReport:
    lines: tuple[str, ...]
    errors: int

    @property
    def exit_code(self) -> int:
        return EXIT_USAGE if self.errors else EXIT_OK


def run_validate(request: ValidateRequest) -> ValidateReport:
    lines, errors, seen = [], 0, set()
    cache: dict = {}
    for raw in request.paths:
        folder = Path(raw).parent if Path(raw).name == "implementation.toml" else Path(raw)
        if folder in seen:
            continue
        seen.add(folder)
        try:
            impl = load_implementation(folder)
            specs = specs_of(impl, None, cache)
        except GrpoConformError as exc:
            errors += 1
            lines.append(f"error: {exc}")
            continue
        members = ", ".join(s.member or s.id for s in specs)
        lines.append(f"{folder}: valid ({impl.name}, spec {impl.manifest.spec}: {members}; sha256 {impl.identity[:16]}…)")
    return ValidateReport(tuple(lines), errors)
