"""How a section's timing tables look, per operation: grpo-logits sections keep tables.py's columns;
a grpo-fused-linear section (issue 31: lm_head GEMM + GRPO loss, spec specs/grpo-fused-linear.v1.json)
shows its own.

Fused-linear columns, and why:
- the heading names the operation (fused linear + GRPO loss), so its numbers are never read as the
  logits-level loss's;
- "x floor (max DRAM, FLOP)": median / the record's binding floor (`floor.floor_ns`, the largest of
  the DRAM, measured-ceiling and arithmetic floors; for this operation the arithmetic one is the
  GEMMs' 2NHV FLOPs at the catalogue's dense tensor-core peak), with which one binds. The logits
  tables' "x floor" is the DRAM ratio alone, which for a GEMM-bound operation says nothing;
- "x GEMM ceiling": median / this run's cuBLAS time of the same GEMMs, read from the timing's
  `gemm_ceiling_ratio` when the record carries one (records before that measurement existed show
  "—");
- "peak extra memory": the largest allocation above the call's starting point (the worker's
  max_memory_allocated - base), as the record states it;
- the backward-only protocol ('backward': the seed benchmark's `y.backward(retain_graph=True)` timed
  after one untimed forward) gets its own table under a title that says what it timed; it is never
  ranked (model.UNRANKED), never compared to #1 and never the page's headline. Cells are won by
  the 'full' protocol, as for the logits operation.
"""

from __future__ import annotations

from grpo_conform.report import tables as T
from grpo_conform.report.model import Row, Section

FUSED = "grpo-fused-linear"
OPERATION_TITLE = {FUSED: "fused linear + GRPO loss (lm_head GEMM and loss in one operation)"}

FUSED_HEADERS = ("workload", "#", "implementation", "median ms (p10-p90)", "wall ms", "x floor (max DRAM, FLOP)",
                 "x GEMM ceiling", "vs #1", "peak extra memory", "conformance")

FUSED_PROTOCOL_TITLES = {
    "full": "full: forward + backward with upstream gradient 1 (the headline: each cell's #1 is won here)",
    "full-scaled": T.PROTOCOL_TITLES["full-scaled"],
    "forward": "forward: the loss alone (the lm_head GEMM and the loss; gradients may be computed here too)",
    "backward": "backward-only: the seed benchmark's protocol, y.backward(retain_graph=True) timed after one "
                "untimed forward. Shown as what it is, never ranked, never a headline: an implementation "
                "that computes its gradients in forward times only the accumulation into weight.grad here",
}


def is_fused(section: Section) -> bool:
    return section.operation == FUSED


def heading_suffix(section: Section) -> str:
    """Appended to the section's heading: the operation's name (logits sections: nothing, as before)."""
    return f": {OPERATION_TITLE[section.operation]}" if section.operation in OPERATION_TITLE else ""


def timing_headers(section: Section) -> tuple[str, ...]:
    return FUSED_HEADERS if is_fused(section) else T.TIMING_HEADERS


def protocol_title(section: Section, protocol: str) -> str:
    titles = FUSED_PROTOCOL_TITLES if is_fused(section) else T.PROTOCOL_TITLES
    return titles.get(protocol, protocol)


def _binding(r: Row) -> str:
    if r.binding_floor_ratio is None:
        return "—"
    return f"{r.binding_floor_ratio:.2f}x" + (f" ({r.floor_binding} binds)" if r.floor_binding else "")


def timing_rows(section: Section, protocol: str) -> list[tuple[str, ...]]:
    if not is_fused(section):
        return T.timing_rows(section, protocol)
    out = []  # the logits table's cells (one per row, same order) with the floor and memory cells replaced
    for r, shared in zip([r for r in section.rows if r.protocol == protocol], T.timing_rows(section, protocol)):
        gemm = T._x(r.gemm_ceiling_ratio)
        if r.gemm_ceiling_ratio is not None and r.gemm_ceiling_layout:  # records since the layouts were timed
            gemm += f" ({r.gemm_ceiling_layout})"
        out.append((shared[0], shared[1], shared[2], shared[3], shared[4], _binding(r), gemm, shared[6],
                    T._bytes(r.peak_bytes), shared[8]))
    return out


def floor_note(section: Section, protocol: str) -> str:
    if not is_fused(section):
        return T.floor_note(section, protocol)
    if protocol == "backward":
        return ("backward-only has no floor of its own (work can move into forward), so no ratio is shown; "
                "judge an implementation by its full time. wall: host-inclusive time per call.")
    return ("x floor: median / the record's binding floor, the largest of its DRAM floor (traffic-v1 bytes at the "
            "datasheet and measured bandwidths) and its arithmetic floor (the GEMMs' 2NHV FLOPs each at the "
            "catalogue's dense tensor-core peak for the operands' dtype); which one binds is named. x GEMM "
            "ceiling: median / this run's cuBLAS time of the same GEMMs, where the record measured it (since "
            "2026-12-05 each GEMM whole or in chunks of rows, whichever was faster, named in brackets per GEMM: "
            "'whole' or the rows per chunk; before, all whole: a ratio under 1 at large batches is a kernel that "
            "chunks its rows). peak extra "
            "memory: the most allocated above the call's start. vs #1: median / the fastest conformant median on "
            "the same workload. wall: host-inclusive time per call.")


def headline_ratio(section: Section, best: Row) -> str:
    """The hero line's ratio: the binding floor for fused sections, the measured DRAM floor otherwise."""
    if is_fused(section):
        return f", {best.binding_floor_ratio:.2f}x the floor (max DRAM, FLOP)" if best.binding_floor_ratio else ""
    return f", {best.measured_floor_ratio:.2f}x the floor" if best.measured_floor_ratio else ""
