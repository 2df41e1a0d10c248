"""The leaderboard as Markdown (for READMEs and pull requests): the same tables as the HTML page,
no plots (a link to the HTML page has them).

Every string that comes from a record (names, paths, messages, reasons, even a payloadType) is
escaped with `text()`: Markdown punctuation is backslash-escaped and `<`, `>`, `&` become entities,
so a record cannot make a link, an image fetched from elsewhere, raw HTML or a heading (issue 29).
Record text is never put in a code span (a backtick in it would end the span).
"""

from __future__ import annotations

import re

from grpo_conform.report import contents as C
from grpo_conform.report import fused as F
from grpo_conform.report import sweep_tables as W
from grpo_conform.report import tables as T
from grpo_conform.report.build import REGENERATE, Leaderboard
from grpo_conform.report.model import Section
from grpo_conform.report.reported import MEANINGS

_PUNCT = re.compile(r"([\\`*_{}\[\]()#!|~])")
_AUTOLINK = re.compile(r"(@)|(:)(?=/)|(?<=www)(\.)", re.IGNORECASE)  # GFM autolinks: a@b.c, x://, www.


def text(value: object) -> str:
    """`value` as inert Markdown text, on one line."""
    s = " ".join(str(value).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _PUNCT.sub(r"\\\1", s)
    return _AUTOLINK.sub(lambda m: "\\" + next(g for g in m.groups() if g), s)


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(text(c) for c in row) + " |" for row in rows]
    return out


def _section(s: Section, level: int) -> list[str]:
    member = f" (member {text(s.member)})" if s.member else ""
    h = "#" * level
    state = "current identity" if s.current else "superseded identity (history)"
    lines = [f"{h} {text(s.spec_id)} {text(s.spec_version)}{member} on {text(s.gpu)}{text(F.heading_suffix(s))}", "",
             f"Spec identity sha256 {text(s.spec_identity)} ({state}); device {text(s.device_name)}.", ""]
    if not s.implementations:
        lines += ["No verified record of this identity.", ""]
        return lines
    lines += table(T.IMPL_HEADERS, T.impl_rows(s)) + [""]
    for protocol in s.protocols:
        lines += [f"{h}# {text(F.protocol_title(s, protocol))}", ""]
        lines += table(F.timing_headers(s), F.timing_rows(s, protocol)) + ["", text(F.floor_note(s, protocol)), ""]
    return lines


def _sweep(sweep) -> list[str]:
    lines = [f"## Shape sweep of implementations/triton on {text(sweep.gpu or 'no GPU')} (benchmark output, not signed "
             "evidence)", "", text(W.INTRO), ""]
    lines += table(W.FILE_HEADERS, W.file_rows(sweep)) + [""]
    lines += table(W.TARGET_HEADERS, W.target_rows(sweep)) + [""]
    for title, headers, rows in W.grids(sweep):
        lines += [f"### {text(title)}", ""] + table(headers, rows) + [""]
    lines += [text(W.CELL_NOTE), ""]
    if sweep.launch:
        lines += ["### Launch-bound call", ""] + table(W.LAUNCH_HEADERS, W.launch_rows(sweep)) + [""]
    if sweep.set_aside:
        lines += ["### Sweep files and rows not shown", ""] + table(W.NOT_SHOWN_HEADERS, W.not_shown_rows(sweep)) + [""]
    return lines


def render_markdown(board: Leaderboard) -> str:
    lines = ["# GRPO loss leaderboard: verified evidence only", "",
             f"Built from {len(board.inputs)} signed record(s) that pass `grpo-conform verify` against "
             f"{text(board.trusted_keys)} (latest run {text(board.latest or 'none')}); records that do not verify are "
             f"listed at the end with the reason. Regenerate: `{REGENERATE}`. One section per spec member and GPU at "
             "the identity the checkout's spec resolves to; superseded identities follow it as history. Per "
             "implementation (folder and identity) the identity in the checkout's tree counts; each cell is the "
             "newest record of it that timed that workload.", ""]
    if board.sections:
        lines += ["## Contents", "", text(C.INTRO), ""]
        lines += table(C.HEADERS, C.rows(board.sections)) + [""]
    for s in board.sections:
        lines += _section(s, 2)
        if s.history:
            lines += [f"### History of {text(s.spec_id)} on {text(s.gpu)}: superseded spec identities", "",
                      "Not ranked against the current identity: the spec's meaning or workloads differed.", ""]
            for old in s.history:
                lines += _section(old, 4)
    if board.reported:
        lines += ["## Reported records (third party, not reproduced)", "",
                  f"Audited by `grpo-conform audit`, each row against the spec its 'audited against' column names "
                  f"({text(board.audited_against)}): rows of a fused lm_head + loss kernel against the fused-linear "
                  "spec, the others against the logits-level one. What each verdict means:", ""]
        lines += [f"- **{text(k)}**: {text(v)}" for k, v in MEANINGS.items()] + [""]
        lines += table(T.REPORTED_HEADERS, T.reported_rows(board.reported)) + [""]
    for sw in board.sweeps:
        lines += _sweep(sw)
    lines += ["## Records not shown", ""]
    if board.rejected:
        lines += table(("record", "why it is not shown"), [(r.path, r.reason) for r in board.rejected]) + [""]
    else:
        lines += ["Every record given verified.", ""]
    return "\n".join(lines)
