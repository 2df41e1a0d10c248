"""A slot process of `--jobs`/`--gpus` (see parallel.py): `python -m grpo_conform.gate.slot IN OUT`
reads a CheckRequest (JSON) from IN, runs it here, prints progress lines on stdout and writes the
JSON report to OUT. A SIGTERM from the parent ends it cleanly: its workers are closed and their
files removed before it exits (143)."""

from __future__ import annotations

import json
import sys

from grpo_conform.gate.signals import EXIT_TERMINATED, Terminated, install_handlers


def main(argv: list[str]) -> int:
    install_handlers()
    # after the handlers: a SIGTERM during the engine's import (torch, seconds) must already be handled
    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.errors import GrpoConformError

    source, target = argv
    fields = json.loads(open(source).read())
    for key in ("paths", "workloads", "members", "checks"):
        fields[key] = tuple(fields.get(key) or ())
    fields["units"] = tuple(tuple(u) for u in fields.get("units") or ())
    fields["shard"] = tuple(fields["shard"]) if fields.get("shard") else None
    request = CheckRequest(**fields)
    try:
        report = run_check(request, progress=lambda line: print(line, flush=True))
    except Terminated:
        from grpo_conform.isolation.session import end_all  # with the engine's imports above

        end_all()  # after the run's finally blocks: nothing of this slot's workers is left
        return EXIT_TERMINATED
    except GrpoConformError as exc:
        print(f"error: {exc}", flush=True)
        return exc.exit_code
    with open(target, "w") as f:
        json.dump(report.to_json(), f)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
