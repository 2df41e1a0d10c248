"""The calls the once-per-member probes make beyond the default workloads (`reach`, `other-dtypes`): their shapes
and dtypes, drawn from a secret of this process and the member instead of a workload's seeds, so that the slot's
compile-ahead worker (check_ahead.py) can compile their kernels before the member's first workload calls them.

Why: on an H100 (thirty-first session, round35c) `reach` took 4.6-6.4 s of each masked member's first workload,
almost all of it compiling kernels for shapes and dtypes no other call launches (three calls of a few thousand
to a few million elements), one after another in the slot's own worker.

What a hostile implementation gains: its second worker sees these shapes a workload earlier than its slot worker
does, and files it leaves in its compile cache reach the slot's worker (the store is shared on purpose). A kernel
could then be right only at shapes it was shown, and wrong at every other, which is what reach exists to catch. So
each probe keeps one call the compile-ahead worker is never shown (`announced: false` in the draws): reach redraws one of its calls,
other-dtypes one of its dtype passes, chosen and drawn from the workload's own seeds when the probe runs. A kernel
that cannot tell which call that will be has to be right at shapes nobody announced; the call costs its own
compiles, one of reach's three and one of other-dtypes' two.

The secret is fresh in each process that runs a check: two runs draw other shapes. A member whose workloads span
two worker processes (a worker restarted after a hang) meets the same shapes in both.
"""

from __future__ import annotations

import functools
import math
import os
import random
import secrets
from dataclasses import dataclass
from typing import Any

from grpo_conform.spec.documents import read_document
from grpo_conform.spec.model import SpecError
from grpo_conform.ops.grpo_probes import (REACH_ALIGNED, REACH_ALIGNED_BATCH, REACH_ALIGNED_FUSED,
                                          REACH_ALIGNED_ROWS, REACH_CAP, REACH_FLOOR, REACH_FLOOR_CUDA,
                                          REACH_FLOOR_PER_ROW_CPU, REACH_LEAD_SMALL, REACH_LEAD_SMALL_PER_ROW_CPU,
                                          REACH_REMAINDER, REACH_ROWS, REACH_ROWS_PER_ROW_CPU, REACH_SMALL,
                                          REACH_WIDE, REACH_WIDE_SMALL, REACH_BLOCK, REACH_BLOCKS, REACH_LOW,
                                          REACH_SEQ_ALIGNED)

#: drawn once per process: the slot that runs a member's conformance also plans its compile-ahead requests
SECRET = secrets.randbits(64)
#: the rows call's lead axis: its dtype keeps its place in the order (float32 for the masked and fused members) in every
#: run, where a long-row bug too small to show in half precision shows
ROWS_FIXED = "seq"
ENV_TURN = "GRPO_CONFORM_RUN_TURN"  # the run's turn, handed to its slot processes (their environment is the parent's)


def _run_turn() -> int:
    """A number drawn once per run: by its first process, which leaves it in its environment, so the slot processes
    it starts (gate/parallel.py: the parent's environment) turn their members the same way (`member_turn`). Workers
    never see it (isolation/session.py passes no GRPO_CONFORM_* variable)."""
    value = os.environ.get(ENV_TURN, "")
    if not value.isdigit():
        value = str(secrets.randbelow(9973))
        os.environ[ENV_TURN] = value
    return int(value)


RUN_TURN = _run_turn()
REACH = "reach"
ALIGNED = "aligned"  # the lead of reach's aligned call (no one axis: all of them tile-aligned)
WIDE = "vocab-wide"  # the lead of reach's second vocabulary call, past 2^18 (`wide_axes`)
LOW = "low"  # the vocabulary and hidden size near their declared low ends (`low_axes`), a shape in each dtype
BLOCKS = "vocab-blocks"  # the vocabulary a multiple of 2^16 (`blocks_axes`), in each declared dtype
SEQ_ALIGNED = "seq-aligned"  # each sequence a multiple of 256 (`seq_aligned_axes`), in the member's own dtype
ROWS_HALF = "seq-half"  # the fused operation on the CPU: a second rows call, in half precision (`rows_half_axes`)
EVERY_DTYPE = (LOW, BLOCKS)  # the calls made once in each dtype the lead input declares
OTHER_DTYPES = "other-dtypes"


def member_random(spec: Any, *what: object) -> random.Random:
    """The generator of one once-per-member draw (`what`: the probe, then what it draws for)."""
    return random.Random(":".join(map(str, (SECRET, spec.member or spec.id, *what))))


def default_workloads(spec: Any, device_type: str) -> list[Any]:
    return list(spec.workloads_for(device_type))


def unused_dtypes(spec: Any, device_type: str) -> list[str]:
    """The dtypes the differentiable input declares that no default workload of the member on this device uses."""
    lead = spec.differentiable_input
    used = {w.dtypes.get(lead.name, lead.dtypes[0]) for w in default_workloads(spec, device_type)}
    return [d for d in lead.dtypes if d not in used]


def follows(spec: Any) -> list[str]:
    """The inputs whose dtype follows the lead input's (they declare the same dtypes: hidden, weight, bias...)."""
    lead = spec.differentiable_input
    return [t.name for t in spec.inputs if tuple(t.dtypes) == tuple(lead.dtypes)]


def with_dtype(spec: Any, workload: Any, dtype: str) -> dict[str, str]:
    """`workload`'s dtypes with the lead input and its followers in `dtype`."""
    return {**workload.dtypes, **{name: dtype for name in follows(spec)}}


# -- reach ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReachCall:
    lead: str  # the axis this call reaches
    axes: dict[str, int]
    dtype: str  # the lead input's


def free_axes(spec: Any) -> list[str]:
    """The axes a workload gives a value (no `equals` derivation); the schema bounds none of them above."""
    return [a.name for a in spec.axes if a.derivation() is None]


def _largest(spec: Any, device_type: str, axis: str) -> int:
    values = []
    for w in default_workloads(spec, device_type):
        raw = w.axes.get(axis)
        values.append(raw if isinstance(raw, int) else getattr(raw, "max", 0) or 0)
    return max(values, default=1)


def _per_row_cpu(spec: Any, device_type: str) -> bool:
    """The fused operation (a GEMM over `hidden` per row) on the CPU, where its kernel runs interpreted, a program a
    row (grpo_probes.REACH_FLOOR_PER_ROW_CPU says why its rows call stays at two sequences of 1089+ there)."""
    return device_type != "cuda" and "hidden" in free_axes(spec)


def _floor(spec: Any, device_type: str, axis: str) -> int:
    floor = REACH_FLOOR_CUDA.get(axis) if device_type == "cuda" else None
    if _per_row_cpu(spec, device_type):
        floor = REACH_FLOOR_PER_ROW_CPU.get(axis)
    return floor or REACH_FLOOR.get(axis, 9)


def _others(spec: Any, device_type: str, lead: str, axis: str) -> tuple[int, int]:
    """The range of a small axis in the call that reaches `lead`."""
    special = {}
    if _per_row_cpu(spec, device_type):
        special = REACH_LEAD_SMALL_PER_ROW_CPU
    return (special.get(lead, {}).get(axis) or REACH_LEAD_SMALL.get(lead, {}).get(axis)
            or REACH_SMALL.get(axis, (1, 3)))


def reach_axes(spec: Any, device_type: str, r: random.Random) -> list[dict[str, int]]:
    """One shape per free axis, that axis reached and the others small, in the spec's axis order. Each axis
    alone: a wide vocabulary with a wide hidden size would make one large GEMM, and a kernel's switch on one of
    them shows with the other small. The rows call (`seq`) has two or three sequences (REACH_LEAD_SMALL), on the CPU
    for the fused operation two past 2048 rows: a hostile kernel cannot tell a reach call by its batch, every batch
    from 1 to 288 occurring in some call or workload, nor by its length (drawn, odd)."""
    free = free_axes(spec)
    shapes = []
    for lead in free:
        shape = {}
        for axis in free:
            if axis == lead:
                low = min(max(_floor(spec, device_type, axis), 2 * _largest(spec, device_type, axis) + 1),
                          REACH_CAP.get(axis, 64))
                low = past_blocks(low, REACH_REMAINDER.get(axis, 0))
                if axis == "seq" and shape.get("batch", 1) > 1:  # two or three sequences past REACH_ROWS rows
                    rows = REACH_ROWS_PER_ROW_CPU if _per_row_cpu(spec, device_type) else REACH_ROWS
                    low = max(low, -(-rows // shape["batch"]))
                shape[axis] = (low + 2 * r.randint(0, 3)) | 1  # odd: off every power of two (past 1)
            else:
                lo, hi = _others(spec, device_type, lead, axis)
                shape[axis] = r.randint(lo, hi)
        shapes.append(shape)
    return shapes


def aligned_axes(spec: Any, device_type: str, r: random.Random) -> dict[str, int]:
    """Reach's aligned call: the corner the odd sizes of every other CPU call never reach, each axis a multiple of
    a large power of two. Rows (batch x seq) REACH_ALIGNED_ROWS, batch a power of two (REACH_ALIGNED_BATCH, so seq
    is one too); vocabulary and hidden m x 2^k, m 1 or 3, in REACH_ALIGNED's ranges (the fused operation's
    vocabulary in REACH_ALIGNED_FUSED's), each a multiple of its range's low end. A kernel whose last tile along an
    axis is `size % TILE` wide drops a full tile here for every power-of-two TILE up to that multiple (and 3 x 2^j
    where m is 3): vocabulary tiles of 256 at V 32768/128256, split-K of 64 at H 4096 (thirty-sixth session).

    How a hostile kernel tells this call apart: every axis divisible by a large power of two at once. That is the
    property under test and the one real models have (V 32768, 128256, 262144; H 2048-8192; rows a multiple of
    the micro-batch), so a kernel right only when aligned is right on them too; a kernel right here but wrong at
    larger aligned sizes (V past 4096 on the fused operation, rows past 128) passes the CPU and is caught only by
    CUDA's default workloads (V 32768 and 128256, H 2048 and 4096, rows 2048-16384). The sizes are drawn (six
    values an axis, one call redrawn unannounced: `reach_calls`), so no one shape can be recognised."""
    free = free_axes(spec)
    ranges = {**REACH_ALIGNED, **(REACH_ALIGNED_FUSED if "hidden" in free else {})}
    lo, hi = REACH_ALIGNED_BATCH
    batch = r.choice([1 << k for k in range(lo.bit_length() - 1, hi.bit_length()) if lo <= 1 << k <= hi])
    shape = {}
    for axis in free:
        if axis == "batch":
            shape[axis] = batch
        elif axis == "seq":
            shape[axis] = REACH_ALIGNED_ROWS // batch
        else:
            low, high = ranges[axis]
            shape[axis] = r.choice([m << k for m in (1, 3) for k in range(high.bit_length())
                                    if low <= m << k <= high and (m << k) % low == 0])
    return shape


def wide_axes(spec: Any, device_type: str, r: random.Random) -> dict[str, int]:
    """Reach's wide-vocabulary call: the vocabulary odd in REACH_WIDE's range, past 2^18 (Gemma 3's 262208), the
    other axes small as in the vocabulary call. The vocabulary call stays in (2^17, 2^18] (REACH_CAP), so a kernel
    with a path for each band meets both.

    How a hostile kernel passes it while wrong: a path taken only past REACH_WIDE's top (2^18 + 2^14), or only in
    a band between the two calls' draws; a path wrong only in a dtype other than the member's own (this call runs
    in its own dtype, as the aligned call does) or only at more rows (1-4 here)."""
    ((wide, (lo, hi)),) = REACH_WIDE.items()
    return {axis: (r.randint(lo, hi) | 1) if axis == wide else r.randint(*REACH_WIDE_SMALL.get(axis, (1, 2)))
            for axis in free_axes(spec)}


def wide_applies(spec: Any, device_type: str) -> bool:
    """Whether reach makes its wide-vocabulary call for this member on this device: every member with a vocabulary
    axis, but the fused operation on the CPU, whose interpreted kernel pays per vocabulary block (2 rows at V
    275547: 3.8 s of triton-fused, against 0.4 s for the other operation; thirty-seventh session), so a fused
    kernel's path past 2^18 is caught on CUDA alone."""
    return set(REACH_WIDE) <= set(free_axes(spec)) and not _per_row_cpu(spec, device_type)


def low_axes(spec: Any, device_type: str, r: random.Random) -> dict[str, int]:
    """Reach's low call: every free axis drawn in REACH_LOW's range, never below the spec's declared minimum
    (vocabulary 2-31: no other call goes below 32). How a hostile kernel passes it while wrong: a path for a
    vocabulary below 2 (none: the domain starts there) or between 32 and the workloads' sizes (their draws cover it)."""
    least = {a.name: a.min or 1 for a in spec.axes}
    return {a: r.randint(max(REACH_LOW.get(a, (1, 3))[0], least[a]), max(REACH_LOW.get(a, (1, 3))[1], least[a]))
            for a in free_axes(spec)}


def blocks_axes(spec: Any, device_type: str, r: random.Random) -> dict[str, int]:
    """Reach's vocabulary-blocks call: the vocabulary m x 2^16, m in REACH_BLOCKS' range, the other axes as the
    wide call's. How a hostile kernel passes it while wrong: a path only at multiples of 2^17 or more not drawn
    here (m 2-4 covers 2^17 and 2^18 and 3 x 2^16), or only past 4 x 2^16 and aligned."""
    ((axis, (lo, hi)),) = REACH_BLOCKS.items()
    return {a: r.randint(lo, hi) * REACH_BLOCK if a == axis else r.randint(*REACH_WIDE_SMALL.get(a, (1, 2)))
            for a in free_axes(spec)}


def seq_aligned_axes(spec: Any, device_type: str, r: random.Random) -> dict[str, int]:
    """Reach's seq-aligned call: each sequence 256 x k positions (k in REACH_SEQ_ALIGNED), the other axes as the rows
    call's. How a hostile kernel passes it while wrong: a path at multiples of 256 past 2048 positions, or of a
    larger power of two than the k drawn gives (k 2-8: 512 to 2048, 4 of the 7 values powers of two)."""
    lo, hi = REACH_SEQ_ALIGNED
    return {a: 256 * r.randint(lo, hi) if a == "seq" else r.randint(*_others(spec, device_type, "seq", a))
            for a in free_axes(spec)}


def reach_shapes(spec: Any, device_type: str, r: random.Random) -> list[tuple[str, dict[str, int]]]:
    """(lead, shape) of each reach call: one per free axis (`reach_axes`), the wide-vocabulary call (`wide_axes`),
    the aligned call (`aligned_axes`), the low call (`low_axes`), and the vocabulary-blocks and seq-aligned calls
    (`blocks_axes`, `seq_aligned_axes`) where the wide call applies (`wide_applies`: the fused operation's
    interpreted kernel on the CPU pays per row and per vocabulary block)."""
    leads, shapes = free_axes(spec), reach_axes(spec, device_type, r)
    wide = wide_applies(spec, device_type)
    if wide:
        leads, shapes = leads + [WIDE], shapes + [wide_axes(spec, device_type, r)]
    leads = leads + [ALIGNED, LOW]
    shapes = shapes + [aligned_axes(spec, device_type, r), low_axes(spec, device_type, r)]
    if wide:
        leads = leads + [BLOCKS, SEQ_ALIGNED]
        shapes = shapes + [blocks_axes(spec, device_type, r), seq_aligned_axes(spec, device_type, r)]
    elif _per_row_cpu(spec, device_type) and "seq" in free_axes(spec) and half_dtypes(spec):
        leads, shapes = leads + [ROWS_HALF], shapes + [rows_half_axes(spec, device_type, r)]
    return list(zip(leads, shapes))


def half_dtypes(spec: Any) -> list[str]:
    """The half-precision dtypes the lead input declares, in its order (what the half rows call turns through)."""
    return [d for d in spec.differentiable_input.dtypes if d in ("bfloat16", "float16")]


def rows_half_axes(spec: Any, device_type: str, r: random.Random) -> dict[str, int]:
    """The fused operation's second rows call on the CPU: the rows call's kind of shape (two sequences past 1024 rows
    each, `reach_axes`), drawn apart, in a half-precision dtype (`reach_calls` turns it). Everywhere else the
    seq-aligned call brings 1024+ rows in the member's own dtype; on the CPU the fused operation has none (its
    interpreted kernel pays per row: `wide_applies`), and its other calls hold at most 128 rows. With one rows call,
    either it kept float32 for every member (forty-third and forty-fourth sessions: a kernel wrong only in half
    precision past 1024 rows passed every CPU run, `fused-half-rows-dhidden-chunk-offset`) or it turned (forty-fifth:
    then a single member's float32 long rows came one run in three, and a sequence-level member's half-precision
    long rows never). Two calls hold both in every run, for every member, at ~7.6 s a member of an interpreted fused
    kernel (2,178+ rows at ~3.5 ms a row); an eager kernel's cost is a few milliseconds.

    How a hostile kernel passes it while wrong: a half-precision path wrong only past 1095 rows a sequence or 2,190 in
    all (CUDA's seq-aligned call holds up to 2048 a sequence), or only in the half dtype this member did not meet in
    this run (the other comes in the next member's or the next run's turn)."""
    shapes = reach_axes(spec, device_type, r)
    return shapes[free_axes(spec).index("seq")]


def past_blocks(value: int, least: int) -> int:
    """`value` moved up until its remainder modulo every power of two from 512 up to it is at least `least`: a kernel
    that drops the tail past its last full block then drops `least` or more of the axis, never one element."""
    block = 512
    while least and block <= value:
        value += max(0, least - value % block)
        block *= 2
    return value


def reach_calls(spec: Any, device_type: str, own_dtype: str, fresh: random.Random | None = None) -> list[ReachCall]:
    """The reach probe's calls for this member: one per free axis (`reach_axes`), the lead input's dtype taking in
    turn each declared dtype no default workload uses, then `own_dtype` (the workload's); the wide and aligned calls
    in `own_dtype`, the dtype real models run at such sizes; the low and vocabulary-blocks calls once in each
    declared dtype (a dtype's path meets every size there, not only the one the axis order gives it). With
    `fresh` (the workload's generator, when the probe runs) one call, chosen by it, has its shape drawn from it
    instead: the call compile-ahead was never shown."""
    shapes = reach_shapes(spec, device_type, member_random(spec, REACH))
    if fresh is not None and shapes:
        j = fresh.randrange(len(shapes))
        shapes[j] = _other_than(shapes[j], lambda: reach_shapes(spec, device_type, fresh)[j])
    order = unused_dtypes(spec, device_type) + [own_dtype]
    turn = member_turn(spec)
    calls = []
    for i, (lead, axes) in enumerate(shapes):
        if lead == LOW:  # a shape of its own in each dtype: a tiny vocabulary's path may hide in one row profile
            for k, d in enumerate(spec.differentiable_input.dtypes):
                own_shape = axes if k == 0 else low_axes(spec, device_type, member_random(spec, REACH, LOW, d))
                calls.append(ReachCall(lead, own_shape, d))
        elif lead in EVERY_DTYPE:
            calls += [ReachCall(lead, axes, d) for d in spec.differentiable_input.dtypes]
        elif lead == ROWS_HALF:  # turned through the half dtypes alone: any two consecutive members meet both
            halves = half_dtypes(spec)
            calls.append(ReachCall(lead, axes, halves[turn % len(halves)]))
        else:
            own = lead in (ALIGNED, WIDE, SEQ_ALIGNED)
            step = 0 if lead == ROWS_FIXED else turn  # the rows call keeps its place: float32 (`ROWS_FIXED`)
            calls.append(ReachCall(lead, axes, own_dtype if own else order[(i + step) % len(order)]))
    return calls


def member_turn(spec: Any) -> int:
    """How far along the dtype order this member's free-axis reach calls start, and the upstream kinds of all its reach
    calls (reach.REACH_UPSTREAM): its index in its family plus the run's number (`RUN_TURN`, the same in every slot
    process of a run, so the turn stays balanced across members checked in different slots). With a fixed start
    every member met each free axis in the same dtype and with the same upstream: on the CPU the fused operation's rows
    call (1279+ rows) always had a tiny upstream and its vocabulary call was always float16, so a kernel wrong in
    bfloat16 past a 4096-wide vocabulary passed every run (the forty-second session's red team; docs/checks.md, "The
    reach calls' turn", has the folders and their rates). Shifted by the family
    index, each free-axis call meets every declared dtype across any run of consecutive members (three for three
    dtypes); shifted by the run's number, a single member meets each over runs. The calls' cost does not change. The
    rows call keeps its dtype (`ROWS_FIXED`); its upstream kind turns."""
    index = 0
    if spec.family is not None and spec.source:
        try:
            index = _family_names(spec.source).index(spec.family.member)
        except (SpecError, ValueError):
            index = 0  # a member resolved from elsewhere: the process's number alone
    return index + RUN_TURN


@functools.lru_cache(maxsize=None)
def _family_names(source: str) -> tuple[str, ...]:
    """The member names of the family file `source`, in its order (empty for a file that is not a family)."""
    doc = read_document(source)
    members = doc.get("members") if isinstance(doc, dict) else None
    return tuple(m.get("name") for m in members if isinstance(m, dict)) if isinstance(members, list) else ()


def _other_than(shown: dict[str, int], draw) -> dict[str, int]:
    """A shape from `draw` that is not `shown` (reach's lead axis takes one of four values: a redraw equal to the
    announced one would leave no call unannounced)."""
    for _ in range(64):
        shape = draw()
        if shape != shown:
            return shape
    raise AssertionError(f"64 draws all gave the announced shape {shown}")  # p < 4^-64 for reach's lead axis


# -- other-dtypes -----------------------------------------------------------------------------------------------
def smallest_workload(spec: Any, device_type: str, fallback: Any = None) -> Any:
    """The member's default workload on this device with the fewest elements (fixed axes only)."""
    fixed = [w for w in default_workloads(spec, device_type) if all(isinstance(v, int) for v in w.axes.values())]
    return min(fixed, key=lambda w: math.prod(w.axes.values())) if fixed else fallback


def drawn_axes(spec: Any, w: Any, dtype: str, r: random.Random | None = None) -> dict[str, int]:
    """`w`'s free axes, each drawn in [v, 3v/2]: a fixed, published shape in a dtype no other call uses would
    let a kernel be right there alone. From `r` where given (the pass compile-ahead was never shown), else from the
    member's draw (`member_random`)."""
    def draw(r: random.Random) -> dict[str, int]:
        return {a: r.randint(v, v + v // 2) if isinstance(v, int) else v for a, v in w.axes.items()}

    shown = draw(member_random(spec, OTHER_DTYPES, dtype))
    if r is None:
        return shown
    if all(v + v // 2 == v for v in w.axes.values() if isinstance(v, int)):
        return shown  # axes of 1 leave nothing to draw: the pass still runs, at the only shape there is
    return _other_than(shown, lambda: draw(r))


def other_dtype_workloads(spec: Any, device_type: str) -> list[tuple[str, Any]]:
    """(dtype, workload) of each pass of the other-dtypes probe: the smallest default workload, its axes drawn
    (`drawn_axes`), in each declared dtype no default workload uses."""
    w = smallest_workload(spec, device_type)
    if w is None:
        return []
    return [(d, w.model_copy(update={"dtypes": with_dtype(spec, w, d), "axes": drawn_axes(spec, w, d)}))
            for d in unused_dtypes(spec, device_type)]


def planned_workloads(spec: Any, device_type: str, first: Any) -> list[Any]:
    """Every once-per-member call's workload (reach's, then other-dtypes'), as a compile-ahead proxy wants them;
    `first`: the member's first workload, whose dtypes reach keeps for its inputs that do not follow the lead."""
    lead = spec.differentiable_input
    own = first.dtypes.get(lead.name, lead.dtypes[0])
    out = [first.model_copy(update={"axes": c.axes, "dtypes": with_dtype(spec, first, c.dtype)})
           for c in reach_calls(spec, device_type, own)]
    return out + [w for _, w in other_dtype_workloads(spec, device_type)]
