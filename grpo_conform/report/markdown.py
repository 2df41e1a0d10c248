"""The leaderboard as Markdown (for READMEs and pull requests): the same tables as the HTML page,
no plots (a link to the HTML page has them)."""

from __future__ import annotations

from grpo_conform.report import tables as T
from grpo_conform.report.build import REGENERATE, Leaderboard
from grpo_conform.report.reported import MEANINGS


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(board: Leaderboard) -> str:
    lines = ["# GRPO loss leaderboard: verified evidence only", "",
             f"Built from {len(board.inputs)} signed record(s) that pass `grpo-conform verify` against "
             f"`{board.trusted_keys}` (latest run {board.latest or 'none'}); records that do not verify are listed "
             f"at the end with the reason. Regenerate: `{REGENERATE}`.", ""]
    for s in board.sections:
        member = f" (member {s.member})" if s.member else ""
        lines += [f"## {s.spec_id} {s.spec_version}{member} on {s.gpu}", "",
                  f"Spec identity sha256 `{s.spec_identity}`; device `{s.device_name}`.", ""]
        lines += table(T.IMPL_HEADERS, T.impl_rows(s)) + [""]
        for protocol in s.protocols:
            lines += [f"### {T.PROTOCOL_TITLES.get(protocol, protocol)}", ""]
            lines += table(T.TIMING_HEADERS, T.timing_rows(s, protocol)) + ["", T.floor_note(s, protocol), ""]
    if board.reported:
        lines += ["## Reported records (third party, not reproduced)", "",
                  f"Audited against `{board.audited_against}` by `grpo-conform audit`. What each verdict means:", ""]
        lines += [f"- **{k}**: {v}" for k, v in MEANINGS.items()] + [""]
        lines += table(T.REPORTED_HEADERS, T.reported_rows(board.reported)) + [""]
    lines += ["## Records not shown", ""]
    if board.rejected:
        lines += table(("record", "why it is not shown"), [(r.path, r.reason) for r in board.rejected]) + [""]
    else:
        lines += ["Every record given verified.", ""]
    return "\n".join(lines)
