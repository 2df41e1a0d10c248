"""The CI gate around `check`: the plan (selection, changed-since, shards), progress lines, JUnit
XML and Markdown summaries, parallel slots (--jobs/--gpus), and merging shard reports."""
