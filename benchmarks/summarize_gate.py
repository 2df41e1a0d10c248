"""Table for issues 15/17 from the JSON reports of benchmarks/device_gate_gpus.sh: verdicts per
mode (must be identical), wall times, and per-implementation median device times side by side."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def verdicts(doc: dict) -> dict:
    out = {}
    for impl in doc["implementations"]:
        for m in impl.get("members", []):
            checks = sorted((w["workload"], c["check"], c["status"]) for w in m["workloads"] for c in w["checks"]
                            if c["check"] not in ("determinism",))
            out[(impl["name"], m["spec"]["id"])] = (m["status"], checks)
    return out


def medians(doc: dict) -> dict:
    out = {}
    for impl in doc["implementations"]:
        for w in impl["workloads"]:
            for t in w.get("timings", []):
                med = (t.get("event") or {}).get("median_ns")
                if med:
                    out[(impl["name"], w["workload"], t.get("protocol"))] = med / 1e6
    return out


def main(folder: str) -> None:
    root = Path(folder)
    log = (root / "gate.log").read_text() if (root / "gate.log").exists() else ""
    walls = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) exit \d+ wall ([\d.]+) s", log, re.M)}
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json")) if p.stem in walls}
    print("| mode | wall s | exit | verdicts |")
    print("|---|---|---|---|")
    for name, doc in docs.items():
        v = verdicts(doc)
        print(f"| {name} | {walls[name]:.1f} | {doc['exit_code']} | "
              + ", ".join(f"{k[0]}: {s}" for k, (s, _) in sorted(v.items())) + " |")
    pairs = [("serial-untimed", "gpus0-jobs2-untimed"), ("gpus0", "gpus01")]
    for a, b in pairs:
        if a in docs and b in docs:
            same = verdicts(docs[a]) == verdicts(docs[b])
            print(f"\n{a} vs {b}: verdicts {'IDENTICAL' if same else 'DIFFER'}"
                  + (f"; wall ratio {walls[b] / walls[a]:.2f}" if walls.get(a) else ""))
    if "gpus0" in docs and "gpus01" in docs:
        one, two = medians(docs["gpus0"]), medians(docs["gpus01"])
        print("\n| implementation | workload | protocol | 1 GPU median ms | 2 GPUs median ms | ratio |")
        print("|---|---|---|---|---|---|")
        for key in sorted(one):
            if key in two:
                print(f"| {key[0]} | {key[1]} | {key[2]} | {one[key]:.4f} | {two[key]:.4f} | {two[key] / one[key]:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
