"""The leaderboard as one self-contained static HTML page: inline CSS, inline SVG plots, no script,
no font, image or style sheet from the network (a test loads it in headless Chromium)."""

from __future__ import annotations

from html import escape

from grpo_conform.report import contents as C
from grpo_conform.report import fused as F
from grpo_conform.report import sweep_tables as W
from grpo_conform.report import tables as T
from grpo_conform.report.build import REGENERATE, Leaderboard
from grpo_conform.report.plot import mpl_version, scaling_svg
from grpo_conform.report.reported import MEANINGS

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:1280px;padding:0 1rem;
color:#1b1f24;background:#fff}
h1{font-size:1.6rem;margin:0 0 .3rem}h2{margin-top:2.2rem;border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
h3{font-size:1.05rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;margin:.4rem 0 .3rem;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.first td{background:#eef7ee}tr.bad td{color:#6e7781}
.ok{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}.muted{color:#6e7781}
.verdict-impossible{color:#cf222e;font-weight:600}.verdict-not-comparable{color:#9a6700;font-weight:600}
.verdict-plausible{color:#1a7f37;font-weight:600}.verdict-unknown-GPU{color:#6e7781;font-weight:600}
.note{color:#57606a;font-size:12px;max-width:1100px}.hero{background:#f6f8fa;border:1px solid #d0d7de;
border-radius:6px;padding:.6rem 1rem;margin:.6rem 0}code{font-size:12px}figure{margin:.6rem 0}
figcaption{font-size:12px;color:#57606a}svg{max-width:100%;height:auto}
"""


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]], cls: str, row_classes: list[str] | None = None,
           numeric: tuple[int, ...] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        rc = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="num">{escape(c)}</td>' if j in numeric else f"<td>{_cell(headers[j], c)}</td>"
                        for j, c in enumerate(row))
        body.append(f"<tr{rc}>{cells}</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _cell(header: str, text: str) -> str:
    if header in ("conformance", "verdict"):
        return f'<span class="{"ok" if text.startswith("conformant") else "fail"}">{escape(text)}</span>'
    if header == "audit":
        return f'<span class="verdict-{escape(text.replace(" ", "-"))}">{escape(text)}</span>'
    return escape(text)


def _section(s, level: int = 2) -> str:
    member = f" (member {escape(s.member)})" if s.member else ""
    state = "current identity" if s.current else "superseded identity (history)"
    anchor = escape(C.anchor(s))
    parts = [f'<section class="board{"" if s.current else " history"}" id="{anchor}">',
             f"<h{level}>{escape(s.spec_id)} {escape(s.spec_version)}{member} on {escape(s.gpu)}"
             f"{escape(F.heading_suffix(s))}</h{level}>",
             f'<p class="note">spec identity sha256 <code>{escape(s.spec_identity)}</code> ({state}); device '
             f"{escape(s.device_name)}</p>"]
    if not s.implementations:
        parts.append('<p class="note">No verified record of this identity.</p>')
    best = T.first_by_protocol(s, "full") or next((T.first_by_protocol(s, p) for p in s.protocols
                                                   if T.first_by_protocol(s, p)), None)
    if best is not None:
        ratio = F.headline_ratio(s, best)
        parts.append(f'<div class="hero"><strong>#1 at batch {best.batch} ({escape(best.protocol)}): '
                     f"{escape(best.implementation)}, {best.median_ms:.4g} ms</strong>{ratio}; signed, verified, "
                     "conformant on every check of the record.</div>")
    parts.append("<h3>Implementations</h3>")
    parts.append(_table(T.IMPL_HEADERS, T.impl_rows(s), "implementations"))
    for protocol in s.protocols:
        rows = [r for r in s.rows if r.protocol == protocol]
        classes = ["first" if r.rank == 1 else "bad" if not r.conformant else "" for r in rows]
        parts.append(f"<h3>{escape(F.protocol_title(s, protocol))}</h3>")
        parts.append(_table(F.timing_headers(s), F.timing_rows(s, protocol), f"timings protocol-{protocol}", classes,
                            numeric=(1, 3, 4, 5, 6, 7) if F.is_fused(s) else (1, 3, 4, 5, 6)))
        parts.append(f'<p class="note">{escape(F.floor_note(s, protocol))}</p>')
        svg = scaling_svg(s, protocol)
        if svg:
            parts.append(f'<figure class="plot" data-protocol="{escape(protocol)}" data-matplotlib="{mpl_version()}">'
                         f'{svg}<figcaption>Scaling by '
                         f"batch, {escape(protocol)}: median device time per implementation (log scale), dashed "
                         "black: the DRAM floor; dotted: not conformant.</figcaption></figure>")
    if s.history:
        parts.append(f"<details class=\"history\"><summary>History: {len(s.history)} superseded spec identit"
                     f"{'y' if len(s.history) == 1 else 'ies'} of {escape(s.spec_id)} on {escape(s.gpu)} (not ranked "
                     "against the current one)</summary>")
        parts += [_section(old, 3) for old in s.history]
        parts.append("</details>")
    parts.append("</section>")
    return "\n".join(parts)


def _contents(sections, others: list[tuple[str, str]]) -> str:
    """The contents table, each section's line a link to it; then the page's other parts (id, title)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in C.HEADERS)
    body = []
    for s, row in zip(sections, C.rows(sections)):
        cells = [f'<td><a href="#{escape(C.anchor(s))}">{escape(row[0])}</a></td>']
        cells += [f'<td class="num">{escape(c)}</td>' if j in (2, 3, 4) else f"<td>{escape(c)}</td>"
                  for j, c in enumerate(row) if j]
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<nav id="contents"><h2>Contents</h2><p class="note">{escape(C.INTRO)}</p>'
            f'<table class="contents"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            '</tbody></table><p class="note">Also: '
            + " · ".join(f'<a href="#{escape(i)}">{escape(t)}</a>' for i, t in others) + "</p></nav>")


def _sweep_anchor(i: int) -> str:
    return "sweep" if i == 0 else f"sweep-{i + 1}"


def _sweep(sweep, anchor: str) -> str:
    parts = [f'<section id="{anchor}"><h2>Shape sweep of implementations/triton on {escape(sweep.gpu or "no GPU")} '
             f'(benchmark output, not signed evidence)</h2><p class="note">{escape(W.INTRO)}</p>',
             _table(W.FILE_HEADERS, W.file_rows(sweep), "sweep-files", numeric=(5,)),
             _table(W.TARGET_HEADERS, W.target_rows(sweep), "sweep-targets")]
    svg = W.sweep_svg(sweep)
    if svg:
        parts.append(f'<figure class="plot" data-protocol="sweep" data-matplotlib="{mpl_version()}">{svg}<figcaption>'
                     "Ours over the member's DRAM floor against the vocabulary, one line per batch, sequence and dtype "
                     "(dashed: float16); dotted: the token level's 1.15x target.</figcaption></figure>")
    for title, headers, rows in W.grids(sweep):
        parts.append(f"<h3>{escape(title)}</h3>")
        parts.append(_table(headers, rows, "sweep-grid", numeric=tuple(range(1, len(headers)))))
    parts.append(f'<p class="note">{escape(W.CELL_NOTE)}</p>')
    if sweep.launch:
        parts += ["<h3>Launch-bound call</h3>", _table(W.LAUNCH_HEADERS, W.launch_rows(sweep), "sweep-launch",
                                                        numeric=(2, 3, 4))]
    if sweep.set_aside:
        parts += ["<h3>Sweep files and rows not shown</h3>",
                  _table(W.NOT_SHOWN_HEADERS, W.not_shown_rows(sweep), "sweep-aside")]
    parts.append("</section>")
    return "\n".join(parts)


def render_html(board: Leaderboard) -> str:
    body = ["<h1>GRPO loss leaderboard: verified evidence only</h1>",
            f'<p class="note">Built from {len(board.inputs)} signed record(s) that pass <code>grpo-conform verify'
            f"</code> against <code>{escape(board.trusted_keys)}</code> (latest run {escape(board.latest or 'none')})."
            " Every number is read from a record whose signature, schema and identities verified; records that do "
            "not verify are listed at the end with the reason. Regenerate: "
            f"<code>{escape(REGENERATE)}</code></p>"]
    if board.sections:
        others = [("reported", "Reported records")] if board.reported else []
        others += [(_sweep_anchor(i), f"Shape sweep ({sw.gpu})") for i, sw in enumerate(board.sweeps)]
        body.append(_contents(board.sections, others + [("rejected", "Records not shown")]))
    body += [_section(s) for s in board.sections]
    if board.reported:
        body.append('<section id="reported"><h2>Reported records (third party, not reproduced)</h2>')
        body.append('<p class="note">Audited by <code>grpo-conform audit</code>, each row against the spec its '
                    f"'audited against' column names (<code>{escape(board.audited_against)}</code>): rows of a fused "
                    "lm_head + loss kernel against the fused-linear spec, the others against the logits-level one. "
                    "What each verdict means:</p><ul class=\"note\">")
        body += [f'<li><span class="verdict-{k.replace(" ", "-")}">{escape(k)}</span>: {escape(v)}</li>'
                 for k, v in MEANINGS.items()]
        body.append("</ul>")
        body.append(_table(T.REPORTED_HEADERS, T.reported_rows(board.reported), "reported", numeric=(4, 5)))
        body.append("</section>")
    body += [_sweep(sw, _sweep_anchor(i)) for i, sw in enumerate(board.sweeps)]
    body.append('<section id="rejected"><h2>Records not shown</h2>')
    if board.rejected:
        body.append(_table(("record", "why it is not shown"), [(r.path, r.reason) for r in board.rejected],
                           "rejected"))
    else:
        body.append('<p class="note">Every record given verified.</p>')
    body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>GRPO loss leaderboard (verified evidence)</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
