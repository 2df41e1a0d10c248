"""The timed protocols' names (docs/timing.md, "Protocols") in a module that imports nothing: the
CLI's option choices read them at start-up without importing torch (floors.py, which re-exports
them, imports it through hardware and timing), so `--help`, `spec`, `verify` and the other commands
that run no kernel start in a fraction of the time."""

PROTOCOLS = ("forward", "full", "full-scaled", "backward")
