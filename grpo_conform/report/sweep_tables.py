"""The shape sweep's tables and figure, shared by the Markdown and HTML pages (sweep.py has the data).

Cells are plain strings; the renderers escape them (a sweep file is unsigned: its paths, notes and GPU name
are shown as inert text). The figure is matplotlib's SVG, deterministic as the scaling plots are (plot.py).
"""

from __future__ import annotations

import io
import re
from typing import Optional

from grpo_conform.report.plot import COLORS, stable_ids
from grpo_conform.report.sweep import MEMBERS, TOKEN_TARGET, Sweep

PALETTE = COLORS + ("#bcbd22",)  # ten (batch, seq) lines at most in the grid
FILE_HEADERS = ("file", "sha256", "run started (UTC)", "GPU", "torch / triton", "copy TB/s",
                "implementations/triton identity", "shapes shown")
TARGET_HEADERS = ("target (issue 36)", "met", "shapes meeting it", "furthest from it",
                  "misses where the least call misses too")
LAUNCH_HEADERS = ("call (1 x 16 x 128256 bf16)", "member", "full, wall ms", "forward, wall ms", "full, host clock ms")
NOT_SHOWN_HEADERS = ("file or row", "why it is not shown")
INTRO = ("Benchmark output of benchmarks/sweep_logits.py, not signed evidence: implementations/triton's full call "
         "(forward + backward, d loss = 1) beside Liger's, timed outside the validator. Each file is named with its "
         "sha256. Every floor and ratio below is recomputed from the shapes and the run's measured copy bandwidth; "
         "a shape comes whole from the newest file that measured it.")
CELL_NOTE = ("Each cell: ours as a multiple of the member's DRAM floor (logits read, masked rows unread, and the "
             "gradient written, at the run's measured copy bandwidth), then Liger's time over ours (L > 1: ours "
             "faster). '-': not measured; 'impossible': below the floor at the GPU's datasheet bandwidth.")


def _ms(value: Optional[float]) -> str:
    return f"{value:.4f}" if value is not None else "-"


def identity_text(sweep: Sweep, identity: Optional[str]) -> str:
    if identity is None:
        return "not recorded (a file written before the eighteenth session)"
    state = "current" if identity == sweep.current_identity else "not the checkout's"
    return f"{identity[:12]}… ({state})"


def file_rows(sweep: Sweep) -> list[tuple[str, ...]]:
    shown = [sum(c.source == i for c in sweep.cells) for i in range(len(sweep.files))]
    return [(f.path, f.sha256[:16] + "…", f.meta.started, f.meta.gpu, f"{f.meta.torch} / {f.meta.triton}",
             f"{f.meta.copy_TBps:.3f}", identity_text(sweep, f.meta.identity), f"{shown[i]} of {f.rows_read} rows")
            for i, f in enumerate(sweep.files)]


def target_rows(sweep: Sweep) -> list[tuple[str, ...]]:
    return [(t.name, "yes" if t.met else "no", f"{t.passed} of {t.total}", t.worst, _least_text(t))
            for t in sweep.targets]


def _least_text(t) -> str:
    """How many of a target's misses the least full call shares (benchmarks/sweep_least.py): the structure's share at
    that call's measured speed on this card, not our kernel's."""
    if t.least_misses is None or not t.misses:
        return "-"
    return f"{t.least_misses} of {t.misses}"


def launch_rows(sweep: Sweep) -> list[tuple[str, ...]]:
    return [(r.impl, r.member or "-", _ms(r.full_wall_ms), _ms(r.forward_wall_ms), _ms(r.full_host_ms))
            for r in sweep.launch]


def grids(sweep: Sweep) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]]:
    """Per member and dtype: (title, headers, rows): a row per (batch, seq), a column per vocabulary; then per dtype
    torch's copy_ of the same logits (what one plain pass reaches at that size: the kernel's own overhead is the
    difference)."""
    out = []
    for member in MEMBERS:
        for dtype in sorted({c.dtype for c in sweep.cells}):
            cells = {(c.batch, c.seq, c.vocab): c for c in sweep.cells if c.member == member and c.dtype == dtype}
            if not cells:
                continue
            vocabs = sorted({v for _, _, v in cells})
            lines = sorted({(b, s) for b, s, _ in cells}, key=lambda bs: (bs[1], bs[0]))
            rows = [(f"b{b} s{s}", *(_cell(cells.get((b, s, v))) for v in vocabs)) for b, s in lines]
            out.append((f"{member}, {dtype}", ("batch, seq", *(f"V {v}" for v in vocabs)), rows))
    for dtype in sorted({c.dtype for c in sweep.cells}):  # one copy_ a shape: the same for every member
        copies = {(c.batch, c.seq, c.vocab): c.copy_x_floor for c in sweep.cells if c.dtype == dtype and c.copy_x_floor}
        if copies:
            vocabs = sorted({v for _, _, v in copies})
            lines = sorted({(b, s) for b, s, _ in copies}, key=lambda bs: (bs[1], bs[0]))
            rows = [(f"b{b} s{s}", *(f"{copies[(b, s, v)]:.3f}x" if (b, s, v) in copies else "" for v in vocabs))
                    for b, s in lines]
            out.append((f"torch copy_ of the same logits, {dtype} (x the plain floor: every row read and written)",
                        ("batch, seq", *(f"V {v}" for v in vocabs)), rows))
    return out


def _cell(c) -> str:
    if c is None:
        return ""
    if c.ours_ms is None:
        return f"- ({c.note})" if c.note else "-"
    if c.impossible:
        return f"{c.x_floor:.3f}x impossible"
    return f"{c.x_floor:.3f}x" + (f", L {c.vs_liger:.2f}" if c.vs_liger else "")


def not_shown_rows(sweep: Sweep) -> list[tuple[str, ...]]:
    return [(where, why) for where, why in sweep.set_aside]


def sweep_svg(sweep: Sweep) -> Optional[str]:
    """One panel per member: ours / floor against the vocabulary (log), a line per (batch, seq, dtype); the
    token level's target dotted. None when nothing was timed."""
    timed = [c for c in sweep.cells if c.ours_ms and not c.impossible]
    if not timed:
        return None
    import matplotlib  # only for the HTML page's plots: the rest of `report` runs without it

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # after use("Agg"): pyplot picks its backend on import

    members = [m for m in MEMBERS if any(c.member == m for c in timed)]
    shapes = sorted({(c.seq, c.batch) for c in timed})  # a colour each; the dtype is the line style
    vocabs = sorted({c.vocab for c in timed})
    with matplotlib.rc_context({"svg.hashsalt": "grpo-conform", "svg.fonttype": "none", "font.size": 9,
                                "font.family": "DejaVu Sans"}):
        fig, axes = plt.subplots(1, len(members), figsize=(4.2 * len(members), 3.6), dpi=100, sharey=True,
                                 squeeze=False)
        try:
            for ax, member in zip(axes[0], members):
                for k, (seq, batch) in enumerate(shapes):
                    for dtype in sorted({c.dtype for c in timed}):
                        pts = sorted((c.vocab, c.x_floor) for c in timed
                                     if (c.member, c.seq, c.batch, c.dtype) == (member, seq, batch, dtype))
                        if pts:
                            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, linewidth=1,
                                    color=PALETTE[k % len(PALETTE)], linestyle="-" if dtype == "bfloat16" else "--",
                                    label=f"b{batch} s{seq} {dtype}")
                if MEMBERS[member][0] == "token":
                    ax.axhline(TOKEN_TARGET, color="black", linewidth=0.8, linestyle=":")
                ax.set_xscale("log")
                ax.set_xticks(vocabs, [f"{v / 1000:.0f}k" for v in vocabs])  # plain text, no mathtext
                ax.minorticks_off()
                ax.tick_params(axis="x", labelsize=7)  # 128k and 152k sit close on a log axis
                ax.set_title(member, fontsize=9)
                ax.set_xlabel("vocabulary")
                ax.grid(True, alpha=0.3)
            axes[0][0].set_ylabel("ours / DRAM floor")
            handles, labels = axes[0][0].get_legend_handles_labels()
            fig.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
            fig.tight_layout()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
        finally:
            plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    return stable_ids(svg, "sweep-" + "-".join(f.sha256[:12] for f in sweep.files))
