"""Which part of benchmarks/sweep_logits.py's grid runs (--vocab, --control, --configs-vocab, --no-launch:
h200_evidence.sh sweep36b) and which launch candidates --configs times per level (configs.FOR_LEVEL, plus
the plain kernels where the staged HEAD path replaced them). Pure: no torch, no GPU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Selection:
    """Which jobs of the grid run (empty tuples: no restriction)."""

    vocabs: tuple = ()
    control: tuple = ()  # (vocab, batch) pairs kept whatever `vocabs` says
    configs_vocabs: tuple = ()
    launch: bool = True

    @classmethod
    def of(cls, args) -> "Selection":
        ints = lambda text: tuple(int(v) for v in text.split(",") if v.strip())  # noqa: E731
        pairs = tuple(tuple(int(x) for x in p.split(":")) for p in args.control.split(",") if p.strip())
        return cls(ints(args.vocab), pairs, ints(args.configs_vocab), not args.no_launch)


def select(run: list[dict], sel: Selection) -> list[dict]:
    """The jobs of `run` that `sel` keeps, in run's (priority) order."""
    def keep(job) -> bool:
        s = job["shape"]
        if job["kind"] == "launch":
            return sel.launch
        if job["kind"] == "configs" and sel.configs_vocabs:
            return s.vocab in sel.configs_vocabs
        return not sel.vocabs or s.vocab in sel.vocabs or (s.vocab, s.batch) in sel.control

    return [j for j in run if keep(j)]


def for_level(configs) -> dict:
    """configs.FOR_LEVEL, plus "no-head" second where the vocabulary is not a multiple of 16 elements
    (sweep_plan.Shape.staged False): those rows ran the plain kernels, one element per access, until the
    head/body/tail split (implementations/triton/staged_rows.py, grad.py) took them, so "no-head" beside
    "shipped" is that change's A/B in one run, the gradients compared too."""
    out = dict(configs.FOR_LEVEL)
    if "no-head" in configs.CANDIDATES:
        for key, names in out.items():
            if not key[1] and "no-head" not in names:
                out[key] = names[:1] + ("no-head",) + names[1:]
    return out
