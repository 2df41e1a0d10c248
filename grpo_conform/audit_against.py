"""Which row of Liger-Kernel's own benchmark CSV a reported fused-linear number is (issue 31, item 7).

Liger's CSV holds the fused kernel twice per provider, mode and batch: token-level importance
sampling (`fused_linear_grpo_loss_token`) and sequence-level, GSPO (`..._sequence`), each row stating
`importance_sampling_level` in its config. A page that copied numbers under the older name
(`fused_linear_grpo_loss`, no level) can have mixed them: the seed page's PyTorch values at batch
4/8/16 (41.5/81.2/160.8 ms) are the sequence-level rows (41.55/81.22/160.82), not the token-level
ones (41.84/81.66/162.64).

Rule: a row that states its level (config or name) is that level. Otherwise, given the CSV with
`audit --against FILE`, the row is compared with the CSV's token- and sequence-level rows of the same
provider, mode, GPU and shape, at the precision the row was written with (41.5 has one decimal: a
source value matches when it rounds to it, |source - 41.5| <= 0.05). Matching only the sequence
row: "matches the sequence-level row"; only the token row: ok; both (equal to that precision):
ambiguous, said so; neither: said so. A note beside the file (`FILE.source.json`, with `repository`,
`commit`, `path`) names the commit the CSV was read at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

from grpo_conform.audit_fused import is_fused, stated_level
from grpo_conform.audit_model import Finding, Record

NOTE_SUFFIX = ".source.json"


def decimals(value: float) -> int:
    """Decimal places of the shortest text of `value` (41.5 -> 1, 22.0 -> 1, 1.97 -> 2)."""
    exponent = Decimal(repr(float(value))).as_tuple().exponent
    return max(0, -int(exponent))


def written_equal(written: float, source: float) -> bool:
    """True when `source` rounds to `written` at the precision `written` was given with."""
    half = Decimal(1).scaleb(-decimals(written)) / 2
    return abs(Decimal(repr(float(source))) - Decimal(repr(float(written)))) <= half


def _key(r: Record) -> tuple:
    shape = tuple(sorted((k, v) for k, v in r.axes.items())) + (("H", r.extra.get("H")),)
    return r.implementation.strip().lower(), r.protocol, r.gpu.strip(), shape


@dataclass(frozen=True)
class Against:
    """Liger's CSV rows of the fused kernel, by (provider, mode, GPU, shape) and level."""

    file: str
    where: str  # "Liger's CSV at <commit>" or the file's name
    rows: dict[tuple, dict[str, Record]]

    def finding(self, record: Record) -> Finding:
        level, stated = stated_level(record)
        if level is not None:
            return Finding("source-row", "mismatch" if level == "sequence" else "ok",
                           f"{'sequence-level (GSPO)' if level == 'sequence' else 'token-level'} row, stated by "
                           f"{stated}")
        found = self.rows.get(_key(record), {})
        token, seq = found.get("token"), found.get("sequence")
        if token is None and seq is None:
            return Finding("source-row", "unknown", f"no row of the same provider, mode, GPU and shape in {self.where}")
        hit = {lvl: r for lvl, r in found.items() if written_equal(record.median_ms, r.median_ms)}
        text = "; ".join(f"{lvl}-level row, {r.source}: {r.median_ms:.4g} ms" for lvl, r in sorted(found.items()))
        if set(hit) == {"sequence"}:
            return Finding("source-row", "mismatch", f"{record.median_ms:g} ms matches the sequence-level (GSPO) row "
                           f"of {self.where}, not the token-level one ({text})")
        if set(hit) == {"token"}:
            return Finding("source-row", "ok", f"{record.median_ms:g} ms matches the token-level row of {self.where} "
                           f"({text})")
        if hit:
            return Finding("source-row", "warning", f"{record.median_ms:g} ms matches both the token- and the "
                           f"sequence-level rows of {self.where} at its precision: which one was copied is unknown "
                           f"({text})")
        return Finding("source-row", "warning", f"{record.median_ms:g} ms matches no row of {self.where} ({text})")


def source_note(path: Path) -> Optional[dict[str, Any]]:
    note = path.with_name(path.name + NOTE_SUFFIX)
    if not note.is_file():
        return None
    try:
        doc = json.loads(note.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def build_against(path: str | Path, records: list[Record]) -> Against:
    """The cross-reference from the records read from Liger's CSV at `path` (audit.read_records)."""
    path = Path(path)
    note = source_note(path)
    if note and note.get("commit"):
        where = f"Liger's CSV at {note['commit']}" + (f" ({note['path']})" if note.get("path") else "")
    else:
        where = f"Liger's CSV {path.name}"
    rows: dict[tuple, dict[str, Record]] = {}
    for r in records:
        level, _ = stated_level(r)
        if is_fused(r) and level in ("token", "sequence"):
            rows.setdefault(_key(r), {})[level] = r
    return Against(str(path), where, rows)

