"""Do several `grpo-conform check --format json` reports give the same verdicts? (issue 15: a serial
run, `--gpus 0` and `--jobs 2` on one GPU must agree). Compares the status of every
(implementation, member, workload, check) against the first report; timings are not verdicts.

    python3 tools/compare_verdicts.py serial.json gpus.json jobs.json    # exit 0: all agree
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def verdicts(path: Path) -> dict[tuple[str, str, str, str], str]:
    report = json.loads(path.read_text())
    out: dict[tuple[str, str, str, str], str] = {}
    for impl in report["implementations"]:
        out[(impl["name"], "", "", "(implementation)")] = impl["status"]
        for member in impl.get("members") or []:
            spec = member.get("spec", {})
            label = spec.get("id", "") if isinstance(spec, dict) else str(spec)
            for w in member.get("workloads", []):
                for c in w["checks"]:
                    out[(impl["name"], label, w["workload"], c["check"])] = c["status"]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    paths = [Path(a) for a in argv]
    base = verdicts(paths[0])
    if not base:
        print(f"{paths[0]}: no verdicts found", file=sys.stderr)
        return 2
    differ = 0
    for p in paths[1:]:
        other = verdicts(p)
        missing = sorted(set(base) ^ set(other))
        changed = sorted(k for k in set(base) & set(other) if base[k] != other[k])
        for k in missing:
            print(f"{p.name}: {'only in ' + paths[0].name if k in base else 'extra'}: {' / '.join(k)}")
        for k in changed:
            print(f"{p.name}: {' / '.join(k)}: {base[k]} in {paths[0].name}, {other[k]} here")
        differ += len(missing) + len(changed)
        print(f"{p.name}: {len(base) - len(changed) - len([k for k in missing if k in base])} of {len(base)} "
              f"verdicts equal to {paths[0].name}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
