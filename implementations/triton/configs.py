"""CUDA launch configurations per shape (issue 36): which chunking and grid a plan launches with.

A plan (plan.Plan) asks `choose(vocab, rows, dtype, level)` once, on CUDA only (the interpreter keeps
plan.cpu_tuning). `TABLE` maps (vocabulary range, rows range, logits dtype, member level) to a named
`Choice`; the first rule that matches wins. level is "sequence" for members whose coefficient couples
a sequence (plan.Semantics.coupled: GSPO, VESPO: statistics in forward, gradient in backward), else
"token".

Decision (2026-12-03): "shipped" is exactly the launch of rounds 4-9 (launch.GPU_DEFAULT for the staged
kernels, the Tuning the plan was given for the plain ones), and every shape takes it except V 32000 in
bf16 and fp16, where the sweeps of device calls round22 and sweep36c measured two candidates faster (the
rules below say by how much). The other choices are candidates only: benchmarks/sweep_logits.py --configs times them per
shape on the GPU (`forced`), checks each one's gradient against the shipped launch, and prints a
replacement TABLE in this module's syntax. A rule moves off "shipped" only after such a measurement
is committed (benchmarks/results/) and the implementation has been run through the validator with it.

Why these candidates (docs/triton-kernel-notes.md, round 6: 20 KB stages, 13 chunks of a 128256 row):
- small vocabularies: at 32000 a 20 KB stage leaves a row as 3 full chunks and one of 1280 elements
  that holds a program slot (and its 20 KB) for the whole row while doing an eighth of the work;
  "balanced" stages keep the chunk count and even the chunks out (4 x 8192 there), "s32k" uses 2;
- unaligned vocabularies (50257): rows off 16-byte boundaries are staged from their first boundary on
  (staged_rows.py, the shipped launch there since issue 36's head path); "no-head" is the launch before
  that path, "plain-*" switch staging off and time the plain kernels (the main kernel's 16384-element
  chunks leave 1105 elements in a 4th chunk: "plain-bal" evens them);
- the sequence level: its backward always has work (the flag never predicts it), and one program per
  work item measured 1.28 ms against 1.34 ms for the persistent grid (notes, round 9): "grad-item*".
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
import triton

from . import launch

LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class Choice:
    """One launch configuration. None: the shipped value. `balance`: stage_bytes is a target, and the
    chunk is shrunk (in whole blocks) so that a row's chunks are as even as that many chunks allow.
    `tuning`: (field, value) pairs replacing fields of plan.Tuning (the plain kernels: main_*, stats_*,
    grad_*); `plain_balance`: main_chunk likewise evened out over a row."""

    stage_bytes: int | None = None
    block: int | None = None
    num_warps: int | None = None
    forward_stage_bytes: int | None = None
    balance: bool = False
    tuning: tuple = ()
    plain_balance: bool = False

    def settings(self, vocab: int, dtype: torch.dtype) -> launch.KernelSettings:
        """The staged kernels' settings for a row of `vocab` elements of `dtype`."""
        base = launch.GPU_DEFAULT
        s = dataclasses.replace(base, **{k: v for k, v in (("stage_bytes", self.stage_bytes), ("block", self.block),
                                                           ("num_warps", self.num_warps),
                                                           ("forward_stage_bytes", self.forward_stage_bytes))
                                         if v is not None})
        if self.balance:
            size = torch.tensor([], dtype=dtype).element_size()
            tile = 32 * s.num_warps * (16 // size)  # the block launch._staged_shape will use
            block = tile * triton.next_power_of_2(max(1, s.block // tile) + 1) // 2
            s = dataclasses.replace(s, stage_bytes=even_chunk(vocab, s.stage_bytes // size, block) * size)
        return s

    def tuning_for(self, tuning, vocab: int):
        """plan.Tuning with this choice's fields replaced (the given tuning where it names none)."""
        t = dataclasses.replace(tuning, **dict(self.tuning)) if self.tuning else tuning
        if self.plain_balance:
            t = dataclasses.replace(t, main_chunk=even_chunk(vocab, t.main_chunk, t.main_block))
        return t


def even_chunk(vocab: int, chunk: int, block: int) -> int:
    """The smallest multiple of `block` that splits `vocab` into as many chunks as `chunk` does."""
    n = triton.cdiv(vocab, max(block, chunk))
    return max(block, triton.cdiv(triton.cdiv(vocab, n), block) * block)


# Named configurations; "shipped" must stay the empty Choice (the launch every record so far describes).
CANDIDATES: dict[str, Choice] = {
    "shipped": Choice(),
    # staged member kernel (token level: the loss's pass; token-is: backward's one pass)
    "balanced": Choice(balance=True),
    "s16k": Choice(stage_bytes=16384),
    "s24k": Choice(stage_bytes=24576),
    "s32k": Choice(stage_bytes=32768),
    "s16k-b1024": Choice(stage_bytes=16384, block=1024),
    "balanced-s32k": Choice(stage_bytes=32768, balance=True),
    # the launch before the head/body/tail split of rows off 16-byte boundaries (staged_rows.py, grad.py): at
    # V % 16 != 0 the plain kernels with one-element accesses; benchmarks/sweep_select.py times it beside the
    # shipped launch there (the split's A/B in one run). Elsewhere it equals "shipped".
    "no-head": Choice(tuning=(("head", False),)),
    # plain kernels (members.py, grad.py), staging off: at V % 16 != 0 they ran there before the head path
    "plain-bal": Choice(tuning=(("staged", False),), plain_balance=True),
    "plain-c8k": Choice(tuning=(("main_chunk", 8192), ("staged", False)), plain_balance=True),
    "plain-c32k": Choice(tuning=(("main_chunk", 32768), ("main_warps", 8), ("staged", False)), plain_balance=True),
    # sequence level: statistics pass (staged) and the backward's grid (plain _grad_kernel)
    "grad-item": Choice(tuning=(("grad_programs_per_sm", 0),)),
    "grad-item4k": Choice(tuning=(("grad_chunk", 4096), ("grad_programs_per_sm", 0))),
    "grad-item8k": Choice(tuning=(("grad_chunk", 8192), ("grad_warps", 8), ("grad_programs_per_sm", 0))),
    "grad-p8-4k": Choice(tuning=(("grad_chunk", 4096), ("grad_programs_per_sm", 8))),
    "stats16k-item": Choice(forward_stage_bytes=16384, tuning=(("grad_programs_per_sm", 0),)),
}

# Which candidates can change anything for a level and path (staged or plain): what --configs times.
FOR_LEVEL = {
    ("token", True): ("shipped", "balanced", "s16k", "s24k", "s32k", "s16k-b1024", "balanced-s32k"),
    ("token", False): ("shipped", "plain-bal", "plain-c8k", "plain-c32k"),  # False: V % 16 != 0 (sweep_plan)
    ("sequence", True): ("shipped", "grad-item", "grad-item4k", "grad-item8k", "grad-p8-4k", "stats16k-item"),
    ("sequence", False): ("shipped", "grad-item", "grad-item4k", "grad-item8k", "plain-bal"),
}


@dataclass(frozen=True)
class Rule:
    """Rows of the table: inclusive ranges (None: unbounded), dtype name as torch spells it
    ("bfloat16"; None: any), level (None: any), the name of a CANDIDATES entry."""

    choice: str
    vocab: tuple = (None, None)
    rows: tuple = (None, None)
    dtype: str | None = None
    level: str | None = None

    def matches(self, vocab: int, rows: int, dtype: str, level: str) -> bool:
        def inside(x, r):
            return (r[0] is None or x >= r[0]) and (r[1] is None or x <= r[1])

        return (inside(vocab, self.vocab) and inside(rows, self.rows) and self.dtype in (None, dtype)
                and self.level in (None, level))


TABLE: tuple[Rule, ...] = (
    # V 32000, bf16 (device call round22, benchmarks/results/h200-2026-12-03e/round22/r/sweep.log, --configs at
    # b2 and b8, s1024): s16k-b1024 took token-is 0.3195 -> 0.2884 ms at b8 (-9.7%) and 0.0864 -> 0.0802 ms at
    # b2 (-7.2%); stats16k-item took GSPO 0.3621 -> 0.3439 ms (-5.0%) and 0.0934 -> 0.0903 ms (-3.3%). Each
    # candidate's gradient matched the shipped launch's (relative difference <= 6e-6).
    Rule("stats16k-item", vocab=(32000, 32000), dtype="bfloat16", level="sequence"),
    Rule("s16k-b1024", vocab=(32000, 32000), dtype="bfloat16", level="token"),
    # V 32000, fp16 (device call sweep36c, benchmarks/results/h200-2026-12-05d/sweep36c/sweep.log, --configs at b2
    # and b8, s1024, over token-is, token-offpolicy-mask and GSPO): s16k-b1024 took token-is 0.3165 -> 0.2868 ms and
    # the masked member 0.2826 -> 0.2634 ms at b8 (7.5% over shipped by geometric mean); stats16k-item took GSPO
    # 0.3619 -> 0.3439 ms (5.1%). Every candidate's gradient matched the shipped launch's (relative difference 0).
    Rule("stats16k-item", vocab=(32000, 32000), dtype="float16", level="sequence"),
    Rule("s16k-b1024", vocab=(32000, 32000), dtype="float16", level="token"),
    Rule("shipped"),
)

_FORCED: list[str] = []  # set by `forced` (benchmarks only): this name for every shape


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def choose(vocab: int, rows: int, dtype: torch.dtype, level: str) -> Choice:
    """The configuration of a CUDA plan: the forced one, else the first matching rule of TABLE."""
    if _FORCED:
        return CANDIDATES[_FORCED[-1]]
    name = dtype_name(dtype)
    for rule in TABLE:
        if rule.matches(vocab, rows, name, level):
            return CANDIDATES[rule.choice]
    return CANDIDATES["shipped"]


@contextlib.contextmanager
def forced(name: str):
    """Every plan built inside uses CANDIDATES[name] (plans already cached keep theirs: the caller
    clears impl._PLANS)."""
    if name not in CANDIDATES:
        raise KeyError(f"unknown launch configuration {name!r}; known: {sorted(CANDIDATES)}")
    _FORCED.append(name)
    try:
        yield CANDIDATES[name]
    finally:
        _FORCED.pop()


def rule_source(rule: Rule) -> str:
    """A rule as a line of this module's TABLE."""
    parts = [repr(rule.choice)]
    for field in ("vocab", "rows"):
        value = getattr(rule, field)
        if value != (None, None):
            parts.append(f"{field}={tuple(value)!r}")
    for field in ("dtype", "level"):
        if getattr(rule, field) is not None:
            parts.append(f"{field}={getattr(rule, field)!r}")
    return f"Rule({', '.join(parts)}),"
