"""Reports built from results and evidence: `failures` (what a failed check run ends with) and the
leaderboard (`grpo-conform report EVIDENCE...`: verified records only, HTML, Markdown, JSON)."""
