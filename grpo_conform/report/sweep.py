"""Shape sweeps of the logits kernel in the report (`grpo-conform report --sweep FILE`, issue 36).

A sweep is benchmarks/sweep_logits.py's JSON: implementations/triton (and Liger beside it) timed over a
grid of vocabularies, batches, sequence lengths and dtypes, outside the validator. It is benchmark output,
not signed evidence, and the page says so: each file is named with its sha256 and its provenance (GPU,
versions, the run's start and, in files written since the eighteenth session, the commit and the folder's
identity), and nothing of it is ranked against the records.

What is read is the measurement, never a conclusion: per row the shape, the member, the run's measured
copy bandwidth and the times. Each floor is recomputed from the shape (a row whose stated floor does not
follow from it is set aside with the reason), every ratio is formed here, and the issue's targets are
judged here over the merged rows, so an edited `verdicts` or `ours_x_floor` in a file changes nothing. A
time below the floor at the GPU's datasheet bandwidth is impossible: shown, flagged, kept out of the
targets. Several files merge by shape: each shape (V, batch, seq, dtype) comes whole from the newest run
that measured it, so the members compared at one shape were timed in one run. Files of different GPUs never
merge: each GPU (the name its file gives) is a sweep of its own, with its own targets (`load_sweeps`), so a
newer file from another card cannot stand in for this card's shapes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_conform.errors import EXIT_USAGE, GrpoConformError
from grpo_conform.hardware import load_catalogue

FORMAT = "grpo-conform-sweep/1"  # written since the eighteenth session; earlier files carry no format
#: member -> (level, whether masked rows are left unread: its floor reads only the unmasked rows)
MEMBERS = {"token-is": ("token", False), "token-offpolicy-mask": ("token", True),
           "sequence-offpolicy-mask": ("sequence", True)}
SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
SEED = (128256, 1024)  # the seed spec's vocabulary and sequence
FLOOR_TOLERANCE = 1e-6  # a stated floor must equal the one the shape gives, to float rounding
TOKEN_TARGET, SEED_TARGET, GSPO_TARGET, LAUNCH_TARGET_MS = 1.15, 1.12, 1.2, 0.12
#: the launch-bound row of the least full call (benchmarks/sweep_least.py: autograd's node and two device operations)
LEAST_CALL = "least-autograd-call"


class SweepInputError(GrpoConformError):
    """A --sweep path that does not exist."""

    exit_code = EXIT_USAGE


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # derived fields of a file are ignored, not trusted


class SweepMeta(_Loose):
    gpu: str = Field(min_length=1)
    torch: str = ""
    triton: str = ""
    liger: bool | str = False  # True, or Liger's version in files that name it
    copy_TBps: float = Field(gt=0)
    started: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    commit: Optional[str] = None
    dirty: Optional[bool] = None
    identity: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{64}$")  # implementations/triton's


class SweepRow(_Loose):
    vocab: int = Field(ge=1)
    batch: int = Field(ge=1)
    seq: int = Field(ge=1)
    dtype: Literal["bfloat16", "float16", "float32"]
    member: Literal["token-is", "token-offpolicy-mask", "sequence-offpolicy-mask"]
    floor_ms: Optional[float] = Field(default=None, gt=0)
    unmasked_fraction: Optional[float] = Field(default=None, ge=0, le=1)
    ours_ms: Optional[float] = Field(default=None, gt=0)
    liger_ms: Optional[float] = Field(default=None, gt=0)
    copy_ms: Optional[float] = Field(default=None, gt=0)
    # the least full call at this shape (benchmarks/sweep_least.py): a loss kernel, then one pass moving what the
    # member must move; timed as ours is. Token-level rows of files written since the forty-seventh session
    least_ms: Optional[float] = Field(default=None, gt=0)
    note: str = ""


class LaunchRow(_Loose):
    impl: str
    member: Optional[str] = None
    full_wall_ms: Optional[float] = Field(default=None, gt=0)
    forward_wall_ms: Optional[float] = Field(default=None, gt=0)
    full_host_ms: Optional[float] = Field(default=None, gt=0)


class SweepDoc(_Loose):
    format: Optional[Literal["grpo-conform-sweep/1"]] = None
    meta: SweepMeta
    rows: tuple[SweepRow, ...] = Field(min_length=1)
    launch: tuple[LaunchRow, ...] = ()


@dataclass(frozen=True)
class SweepFile:
    path: str
    sha256: str
    meta: SweepMeta
    rows_read: int
    launch: tuple[LaunchRow, ...]


@dataclass(frozen=True)
class Cell:
    """One (shape, member) as the page shows it: every number formed here."""

    vocab: int
    batch: int
    seq: int
    dtype: str
    member: str
    source: int  # index into Sweep.files
    floor_ms: float  # at the run's measured copy bandwidth (masked members: unmasked rows read)
    plain_floor_ms: float  # every row read and written at that bandwidth: what torch's copy_ of the logits moves
    datasheet_floor_ms: Optional[float]  # at the GPU's datasheet DRAM bandwidth
    ours_ms: Optional[float]
    liger_ms: Optional[float]
    copy_ms: Optional[float]
    note: str
    least_ms: Optional[float] = None  # the least full call at this shape, where the file measured it

    @property
    def shape(self) -> str:
        return f"V{self.vocab} b{self.batch} s{self.seq} {self.dtype}"

    @property
    def x_floor(self) -> Optional[float]:
        return self.ours_ms / self.floor_ms if self.ours_ms else None

    @property
    def vs_liger(self) -> Optional[float]:
        """Liger's time over ours (> 1: ours faster)."""
        return self.liger_ms / self.ours_ms if self.ours_ms and self.liger_ms else None

    @property
    def copy_x_floor(self) -> Optional[float]:
        """torch's copy_ of the same logits over the plain floor: what one plain pass reaches at this size."""
        return self.copy_ms / self.plain_floor_ms if self.copy_ms else None

    @property
    def least_x_floor(self) -> Optional[float]:
        """The least full call over the member's floor: what a call of two device operations reached here (measured)."""
        return self.least_ms / self.floor_ms if self.least_ms else None

    @property
    def impossible(self) -> bool:
        return bool(self.ours_ms and self.datasheet_floor_ms and self.ours_ms < self.datasheet_floor_ms)

    def to_json(self) -> dict[str, Any]:
        return {"vocab": self.vocab, "batch": self.batch, "seq": self.seq, "dtype": self.dtype, "member": self.member,
                "source": self.source, "floor_ms": self.floor_ms, "plain_floor_ms": self.plain_floor_ms,
                "copy_x_floor": self.copy_x_floor, "datasheet_floor_ms": self.datasheet_floor_ms,
                "ours_ms": self.ours_ms, "liger_ms": self.liger_ms, "copy_ms": self.copy_ms,
                "x_floor": self.x_floor, "vs_liger": self.vs_liger, "impossible": self.impossible, "note": self.note,
                "least_ms": self.least_ms, "least_x_floor": self.least_x_floor}


@dataclass(frozen=True)
class Target:
    name: str
    passed: int
    total: int
    worst: str  # where it is furthest from the target, with the value
    # of the shapes that miss it, those where the least full call misses it too (the structure's share at that call's
    # measured speed, not our kernel's); None where the target has no least call to compare with
    least_misses: Optional[int] = None

    @property
    def met(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def misses(self) -> int:
        return self.total - self.passed

    def to_json(self) -> dict[str, Any]:
        return {"target": self.name, "met": self.met, "passed": self.passed, "total": self.total, "worst": self.worst,
                "least_misses": self.least_misses}


@dataclass(frozen=True)
class Sweep:
    files: tuple[SweepFile, ...]
    cells: tuple[Cell, ...]
    set_aside: tuple[tuple[str, str], ...]  # (where, why): files and rows not shown
    launch: tuple[LaunchRow, ...]  # the newest file's launch-bound rows
    launch_source: Optional[int]
    current_identity: Optional[str]  # implementations/triton's identity in the checkout now

    @cached_property
    def targets(self) -> tuple[Target, ...]:
        return judge(self.cells, self.launch)

    @property
    def gpu(self) -> str:
        """The GPU every file of this sweep names ("" for files none of which could be read)."""
        return self.files[0].meta.gpu if self.files else ""

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu,
                "files": [{"path": f.path, "sha256": f.sha256, "rows_read": f.rows_read, **f.meta.model_dump()}
                          for f in self.files],
                "current_identity": self.current_identity, "cells": [c.to_json() for c in self.cells],
                "set_aside": [{"where": w, "why": y} for w, y in self.set_aside],
                "launch": {"source": self.launch_source, "rows": [r.model_dump() for r in self.launch]},
                "targets": [t.to_json() for t in self.targets]}


def floor_ms(row: SweepRow, bytes_per_s: float, plain: bool = False) -> Optional[float]:
    """The member's DRAM floor at `bytes_per_s`: the logits read (masked members: the unmasked rows; `plain`:
    every row) and the gradient written, over every row of [batch, seq + 1, vocab]. None when a masked row has no
    unmasked share."""
    full = row.batch * (row.seq + 1) * row.vocab * SIZES[row.dtype]
    if plain or not MEMBERS[row.member][1]:
        return 2 * full / bytes_per_s * 1e3
    if row.unmasked_fraction is None:
        return None
    unmasked_rows = round(row.unmasked_fraction * row.batch * row.seq)
    return (unmasked_rows * row.vocab * SIZES[row.dtype] + full) / bytes_per_s * 1e3


def _datasheet_bps(gpu: str) -> Optional[float]:
    found = load_catalogue().lookup(gpu)
    return found.gpu.dram_gbps * 1e9 if found is not None else None


def load_sweeps(paths: tuple[str, ...], current_identity: Optional[str] = None) -> tuple[Sweep, ...]:
    """The files read and merged, one sweep per GPU (module docstring): the GPU with the most files first, then
    by name. A file that does not parse is set aside with the reason, in the first sweep."""
    files: list[SweepFile] = []
    aside: list[tuple[str, str]] = []
    docs: list[SweepDoc] = []
    for p in dict.fromkeys(paths):
        if not Path(p).is_file():
            what = "a folder, not a file" if Path(p).is_dir() else "no such file"
            raise SweepInputError(f"--sweep {p}: {what} (give the JSON file benchmarks/sweep_logits.py --out wrote)")
        raw = Path(p).read_bytes()
        try:
            doc = SweepDoc.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            aside.append((p, f"not a sweep file: {_first_error(exc)}"))
            continue
        if not (doc.meta.gpu.isascii() and doc.meta.gpu.isprintable()):  # a look-alike "Н200" (round of 2026-12-05)
            aside.append((p, f"GPU {doc.meta.gpu[:80]!r} has characters outside printable ASCII (a look-alike of "
                             "another GPU's name?)"))
            continue
        files.append(SweepFile(p, hashlib.sha256(raw).hexdigest(), doc.meta, len(doc.rows), doc.launch))
        docs.append(doc)
    by_gpu: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        by_gpu.setdefault(f.meta.gpu, []).append(i)
    order = sorted(by_gpu, key=lambda gpu: (-len(by_gpu[gpu]), gpu))
    sweeps = [_merge([files[i] for i in by_gpu[gpu]], [docs[i] for i in by_gpu[gpu]], [], current_identity)
              for gpu in order]
    if not sweeps:
        return (_merge([], [], aside, current_identity),)
    first = sweeps[0]
    sweeps[0] = Sweep(first.files, first.cells, tuple(aside) + first.set_aside, first.launch, first.launch_source,
                      first.current_identity)
    return tuple(sweeps)


def judge_run(doc: dict[str, Any]) -> tuple[Target, ...]:
    """The targets over one run's own rows (what benchmarks/sweep_logits.py prints at its end)."""
    parsed = SweepDoc.model_validate(doc)
    sweep = _merge([SweepFile("<this run>", "", parsed.meta, len(parsed.rows), parsed.launch)], [parsed], [], None)
    return sweep.targets


def _merge(files: list[SweepFile], docs: list[SweepDoc], aside: list, current_identity: Optional[str]) -> Sweep:
    order = sorted(range(len(files)), key=lambda i: (files[i].meta.started, i))  # oldest first: newer overwrite
    chosen: dict[tuple, tuple[int, list[SweepRow]]] = {}
    for i in order:
        by_shape: dict[tuple, list[SweepRow]] = {}
        for row in docs[i].rows:
            by_shape.setdefault((row.vocab, row.batch, row.seq, row.dtype), []).append(row)
        for shape, rows in by_shape.items():
            chosen[shape] = (i, rows)
    cells: list[Cell] = []
    for shape in sorted(chosen):
        i, rows = chosen[shape]
        cells += _cells(files[i], i, rows, aside)
    launch_from = next((i for i in reversed(order) if files[i].launch), None)
    return Sweep(tuple(files), tuple(cells), tuple(aside),
                 files[launch_from].launch if launch_from is not None else (), launch_from, current_identity)


def _cells(f: SweepFile, index: int, rows: list[SweepRow], aside: list) -> list[Cell]:
    """One shape's rows of one file as cells; a member timed twice there is set aside whole (which of its times
    would count is not the file's to choose: an appended fast row would otherwise stand for the shape)."""
    measured, datasheet = f.meta.copy_TBps * 1e12, _datasheet_bps(f.meta.gpu)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.member] = counts.get(row.member, 0) + 1
    out = []
    for row in rows:
        where = f"{f.path}: V{row.vocab} b{row.batch} s{row.seq} {row.dtype} {row.member}"
        floor = floor_ms(row, measured)
        if counts[row.member] > 1:
            aside.append((where, f"the file times this member {counts[row.member]} times at this shape"))
            continue
        if floor is None:
            aside.append((where, "a masked member's row without unmasked_fraction: its floor cannot be formed"))
            continue
        if row.floor_ms is not None and abs(row.floor_ms - floor) > FLOOR_TOLERANCE * floor:
            aside.append((where, f"floor_ms {row.floor_ms:.6g} does not follow from the shape and the run's copy "
                                 f"bandwidth ({floor:.6g} ms): the row was edited or written by another floor model"))
            continue
        out.append(Cell(row.vocab, row.batch, row.seq, row.dtype, row.member, index, floor,
                        floor_ms(row, measured, plain=True), floor_ms(row, datasheet) if datasheet else None,
                        row.ours_ms, row.liger_ms, row.copy_ms, row.note, row.least_ms))
    return out


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        return f"field {'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}"
    return f"not JSON ({exc})"


def _fmt(shape: str, member: str, value: float) -> str:
    return f"{value:.3f}x at {shape} {member}"


def judge(cells: tuple[Cell, ...], launch: tuple[LaunchRow, ...] = ()) -> tuple[Target, ...]:
    """Issue 36's targets over the merged cells: impossible ones left out, and those of a GPU the catalogue does
    not know (no datasheet floor could have flagged them: shown, never judged)."""
    timed = [c for c in cells if c.ours_ms and not c.impossible and c.datasheet_floor_ms is not None]
    out = []
    tok = [c for c in timed if MEMBERS[c.member][0] == "token"]
    if tok:
        worst = max(tok, key=lambda c: c.x_floor)
        out.append(Target(f"token level full ≤ {TOKEN_TARGET}x the floor",
                          sum(c.x_floor <= TOKEN_TARGET for c in tok), len(tok),
                          _fmt(worst.shape, worst.member, worst.x_floor), _least_misses(tok, TOKEN_TARGET)))
    seed = [c for c in tok if (c.vocab, c.seq) == SEED and c.batch in (8, 16)]
    if seed:
        worst = max(seed, key=lambda c: c.x_floor)
        out.append(Target(f"seed shape, batch 8 and 16, ≤ {SEED_TARGET}x",
                          sum(c.x_floor <= SEED_TARGET for c in seed), len(seed),
                          _fmt(worst.shape, worst.member, worst.x_floor), _least_misses(seed, SEED_TARGET)))
    by_shape: dict[str, dict[str, Cell]] = {}
    for c in timed:
        by_shape.setdefault(c.shape, {})[c.member] = c
    ratios = [(s, m["sequence-offpolicy-mask"].ours_ms / m["token-offpolicy-mask"].ours_ms)
              for s, m in by_shape.items() if "sequence-offpolicy-mask" in m and "token-offpolicy-mask" in m]
    if ratios:
        worst_s, worst_r = max(ratios, key=lambda x: x[1])
        out.append(Target(f"GSPO within {GSPO_TARGET}x of token-offpolicy-mask",
                          sum(r <= GSPO_TARGET for _, r in ratios), len(ratios), f"{worst_r:.3f}x at {worst_s}"))
    vs = [c for c in timed if c.vs_liger]
    if vs:
        worst = min(vs, key=lambda c: c.vs_liger)
        out.append(Target("never slower than Liger", sum(c.vs_liger >= 1.0 for c in vs), len(vs),
                          f"Liger / ours {worst.vs_liger:.3f} at {worst.shape} {worst.member}"))
    walls = [r for r in launch if r.impl == "ours" and r.full_wall_ms is not None]
    if walls:
        worst_l = max(walls, key=lambda r: r.full_wall_ms)
        least = next((r.full_wall_ms for r in launch if r.impl == LEAST_CALL and r.full_wall_ms), None)
        out.append(Target(f"launch-bound full call ≤ {LAUNCH_TARGET_MS} ms wall",
                          sum(r.full_wall_ms <= LAUNCH_TARGET_MS for r in walls), len(walls),
                          f"{worst_l.full_wall_ms:.4f} ms, {worst_l.member}",
                          None if least is None else sum(least > LAUNCH_TARGET_MS and least <= r.full_wall_ms
                                                         for r in walls if r.full_wall_ms > LAUNCH_TARGET_MS)))
    return tuple(out)


def _least_misses(cells: list[Cell], target: float) -> Optional[int]:
    """Of the cells over `target`, those whose least full call is over it too; None where no cell has a least call
    (files written before the forty-seventh session). A least call slower than ours is not the least (ours is itself a
    call of that structure): such a cell never counts, so an inflated least_ms in a file cannot excuse a miss."""
    if not any(c.least_ms for c in cells):
        return None
    return sum(c.x_floor > target and c.least_x_floor is not None and c.least_x_floor > target
               and c.least_ms <= c.ours_ms for c in cells)
