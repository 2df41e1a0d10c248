"""Plot a benchmarks/sweep_logits.py result (issue 36), offline: ours as a multiple of each shape's DRAM
floor against the vocabulary, one panel per member, one line per (batch, seq, dtype), the issue's
targets drawn across (1.15x for the token level; for GSPO its three-pass floor's ratio to the two-pass
one at these masks is the least it can be); a second figure: Liger's time over ours.

    python3 benchmarks/sweep_plot.py sweep.json sweep.svg

SVG with a fixed hash salt and no date, so the same JSON gives the same bytes with one matplotlib.
"""

from __future__ import annotations

import json
import sys

MEMBERS = ("token-is", "token-offpolicy-mask", "sequence-offpolicy-mask")


def series(rows: list[dict], member: str, key: str) -> dict:
    """(batch, seq, dtype) -> sorted [(vocab, value)] of the rows that have `key`."""
    out: dict = {}
    for r in rows:
        if r.get("member") == member and isinstance(r.get(key), (int, float)):
            out.setdefault((r["batch"], r["seq"], r["dtype"]), []).append((r["vocab"], r[key]))
    return {k: sorted(v) for k, v in sorted(out.items())}


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "grpo-conform-sweep"
    import matplotlib.pyplot as plt

    rows = doc.get("rows", [])
    fig, axes = plt.subplots(2, len(MEMBERS), figsize=(5 * len(MEMBERS), 8), sharex=True, squeeze=False)
    for col, member in enumerate(MEMBERS):
        for row, (key, target, label) in enumerate((("ours_x_floor", 1.15, "ours / DRAM floor"),
                                                    ("speedup_vs_liger", 1.0, "Liger ms / ours ms"))):
            ax = axes[row][col]
            for (batch, seq, dtype), pts in series(rows, member, key).items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linewidth=1,
                        linestyle="-" if dtype == "bfloat16" else "--", label=f"b{batch} s{seq} {dtype[:4]}")
            ax.axhline(target, color="black", linewidth=0.8, linestyle=":")
            ax.set_xscale("log")
            ax.set_title(f"{member}: {label}", fontsize=9)
            if row == 1:
                ax.set_xlabel("vocabulary")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7)
    meta = doc.get("meta", {})
    fig.suptitle(f"issue 36 sweep: {meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, triton "
                 f"{meta.get('triton', '?')}, copy {meta.get('copy_TBps', float('nan')):.2f} TB/s", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    with open(sys.argv[1]) as fh:
        plot(json.load(fh), sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
