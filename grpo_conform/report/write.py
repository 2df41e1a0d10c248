"""`grpo-conform report`'s outputs: the leaderboard (build.py) rendered as JSON, Markdown or HTML and
written under --out, one file per format."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from grpo_conform.report.build import Leaderboard, ReportRequest, build_leaderboard
from grpo_conform.report.html import render_html
from grpo_conform.report.markdown import render_markdown

OUTPUTS = {"html": "index.html", "markdown": "leaderboard.md", "json": "leaderboard.json"}


def render(board: Leaderboard, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(board.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    if fmt == "markdown":
        return render_markdown(board)
    if fmt == "html":
        return render_html(board)
    raise ValueError(f"unknown report format {fmt!r}: expected one of {', '.join(OUTPUTS)}")


def run_report(request: ReportRequest) -> Leaderboard:
    board = build_leaderboard(request)
    if request.out is None:
        return board
    out = Path(request.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in request.formats:
        target = out / OUTPUTS[fmt]
        target.write_text(render(board, fmt), encoding="utf-8")
        written.append(str(target))
    return replace(board, written=tuple(written))
