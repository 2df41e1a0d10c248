"""Scaling-by-batch plots as inline SVG (matplotlib, Agg backend: no display, no network).

One plot per section and protocol: x = batch, y = median device time, both log scale, one line per
implementation (dashed when it is not conformant), the floor of the fastest-growing workload drawn
as a black dashed line. Deterministic: a fixed hash salt for SVG ids, no date in the metadata, text
kept as text (svg.fonttype none) so the page stays small and searchable.
"""

from __future__ import annotations

import hashlib
import io
import re

from grpo_conform.report.model import Row, Section

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def mpl_version() -> str:
    """matplotlib's version: the SVG it writes may differ from one version to the next."""
    import matplotlib  # only for the HTML page's plots: the rest of `report` runs without it

    return matplotlib.__version__


def batch_series(section: Section, protocol: str) -> tuple[list[int], dict[str, dict[int, Row]]]:
    """Batches and, per implementation, its row at each batch, over the workloads that differ only in
    batch (the largest such family: the seed's seq 1024 x vocab 128256 ladder)."""
    families: dict[str, list[Row]] = {}
    for r in section.rows:
        if r.protocol == protocol and r.batch is not None:
            rest = r.shape.split(" x ", 1)[1] if " x " in r.shape else ""
            families.setdefault(rest, []).append(r)
    if not families:
        return [], {}
    rows = max(families.values(), key=lambda rs: (len({r.batch for r in rs}), len(rs)))
    by_impl: dict[str, dict[int, Row]] = {}
    for r in rows:
        by_impl.setdefault(r.implementation, {})[r.batch] = r  # type: ignore[index]
    return sorted({r.batch for r in rows}), by_impl  # type: ignore[type-var]


def scaling_svg(section: Section, protocol: str) -> str | None:
    """The SVG text (no XML prolog), or None when fewer than two batches were timed."""
    batches, by_impl = batch_series(section, protocol)
    if len(batches) < 2:
        return None
    import matplotlib  # only for the HTML page's plots: the rest of `report` runs without it

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # after use("Agg"): pyplot picks its backend on import

    with matplotlib.rc_context({"svg.hashsalt": "grpo-conform", "svg.fonttype": "none", "font.size": 9,
                                "font.family": "DejaVu Sans"}):
        fig, ax = plt.subplots(figsize=(8.4, 3.8), dpi=100)
        try:
            for i, name in enumerate(sorted(by_impl)):
                pts = by_impl[name]
                xs = [b for b in batches if b in pts]
                ys = [pts[b].median_ms for b in xs]
                honest = all(pts[b].conformant for b in xs)
                ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.6, color=COLORS[i % len(COLORS)],
                        linestyle="-" if honest else ":", label=name if honest else f"{name} (not conformant)")
                ax.annotate(f"{ys[-1]:.3g} ms", (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 0),
                            fontsize=7, va="center", color=COLORS[i % len(COLORS)])
            floors = {}
            fused = section.operation == "grpo-fused-linear"  # its floor: the binding one, max(DRAM, FLOP)
            for pts in by_impl.values():
                for b, r in pts.items():
                    if fused and r.binding_floor_ratio:
                        floors.setdefault(b, r.median_ms / r.binding_floor_ratio)
                    elif not fused and r.floor_ms:
                        floors.setdefault(b, r.floor_ms)
            if floors:
                fx = sorted(floors)
                model = next((r.floor_model for pts in by_impl.values() for r in pts.values() if r.floor_model), "")
                label = ("floor, max(DRAM, FLOP)" if fused else "DRAM floor") + \
                    f" ({model or 'floor'}{'' if fused else ', measured ceilings'})"
                ax.plot(fx, [floors[b] for b in fx], color="black", linestyle="--", linewidth=1.2, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
            from matplotlib.ticker import FuncFormatter, LogLocator  # with the plot's other matplotlib imports

            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))  # plain text, no mathtext
            ax.set_xlabel("batch")
            ax.set_ylabel(f"{protocol}: median device time (ms)")
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.12, 1.0), frameon=False)
            fig.tight_layout()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        finally:
            plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # inline: drop the XML prolog and doctype
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    return stable_ids(svg, f"{section.spec_identity[:12]}-{section.member or ''}-{section.gpu}-{protocol}")


_HASHED_ID = re.compile(r'(id="|#)([mp])([0-9a-f]{10})(?=["\)])')  # a definition or a reference to it


def stable_ids(svg: str, figure: str) -> str:
    """matplotlib names clip paths and markers by a hash of their content's repr, which changes with
    numpy's float repr (numpy 2 writes np.float64(...)): the same plot got other ids from one numpy to the
    next. Each becomes the figure's prefix and its order of first appearance, so the page depends on
    what is drawn, and ids stay unique across the figures of one page (an SVG inlined in HTML shares
    the document's ids)."""
    prefix = "f" + hashlib.sha256(figure.encode()).hexdigest()[:8]
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        key = m.group(2) + m.group(3)
        if key not in names:
            names[key] = f"{prefix}{m.group(2)}{len(names)}"
        return m.group(1) + names[key]

    return _HASHED_ID.sub(rename, svg)
