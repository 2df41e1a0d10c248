"""The page's contents: one line per section with its #1, so the winners can be read without scrolling through
every table (the HTML links each line to its section; the Markdown names it)."""

from __future__ import annotations

from grpo_conform.report import fused as F
from grpo_conform.report import tables as T
from grpo_conform.report.model import NOT_IN_TREE, Section

INTRO = ("Each section's #1: the fastest conformant implementation under full at the largest batch it ranked (its "
         "section has every workload and protocol).")
HEADERS = ("section", "#1 under full, at the largest batch ranked", "median ms", "x floor",
           "conformant, of the implementations with records")


def anchor(s: Section) -> str:
    """The HTML id of a section (html.py's sections carry it)."""
    return (f"{s.spec_id}-{s.gpu}" + ("" if s.current else f"-{s.spec_identity[:12]}")).replace(" ", "-")


def rows(sections) -> list[tuple[str, ...]]:
    """Per section, in the page's order: the #1 of its own hero line (the fastest conformant implementation under
    `full` at the largest batch it ranked), its median and floor ratio, and how many implementations conform."""
    out = []
    for s in sections:
        best = T.first_by_protocol(s, "full")
        conformant = f"{sum(1 for i in s.implementations if i.conformant)} of {len(s.implementations)}"
        title = f"{s.spec_id} on {s.gpu}"
        if best is None:
            out.append((title, _why_none(s), "—", "—", conformant))
            continue
        ratio = F.headline_ratio(s, best).lstrip(", ")
        # an implementation whose records are all of an older folder identity has no cell: the #1 is only the
        # fastest of those with current records, and the line says who was left out (it may have been faster)
        stale = sorted({i.label or i.name for i in s.implementations if NOT_IN_TREE in i.flags})
        unranked = f"; not ranked: {', '.join(stale)} (records of older folder identities only)" if stale else ""
        out.append((title, f"{best.implementation} (batch {best.batch}){unranked}", T._ms(best.median_ms),
                    ratio.split(" ", 1)[0] if ratio else "—", conformant))
    return out


def _why_none(s: Section) -> str:
    if not s.implementations:
        return "no verified record"
    if all(NOT_IN_TREE in i.flags for i in s.implementations):
        return "no cell: records only of folder identities the checkout no longer has (a new run fills it)"
    return "no ranked cell (see the section)"
