"""Token ids (kind `token-ids`): uniform over the vocabulary, plus a drawn subset of the ids real
tokenizers reserve (pad, bos, eos near 0; added special tokens at the top of the table).

The subset is drawn per input set, sometimes empty, each chosen id at a drawn position: no fixed set
of ids marks the validator's inputs (the same five ids in every set did, the timed re-checks'
included). The first set of a workload (`case` 0) always holds one of 0, 1, 2 and one of V-3..V-1
(drawn), so a kernel that mistreats them meets them in call A. When the batch has at least as many tokens as the vocabulary,
every id appears (a tiny vocabulary: every id is a special one).
"""

from __future__ import annotations

import math

import torch

POOL = (0, 1, 2, 3, -4, -3, -2, -1)  # vocab-4 .. vocab-1 as negative offsets
NONE_PROBABILITY = 0.25
MOST = 4  # at most this many of POOL in one set: the five ids every set once held never all appear


def pool_ids(vocab: int) -> list[int]:
    """The ids of POOL in a vocabulary of `vocab` (the generators keep their rows resolvable)."""
    return sorted({p % vocab for p in POOL})


def label(i: int) -> str:
    return str(i) if i >= 0 else f"V{i}"


def draw_specials(vocab: int, n: int, case: int | None, gen: torch.Generator) -> list[int]:
    """1 to MOST offsets from POOL (at most n, distinct ids): none with probability 1/4, never at case 0."""
    u = float(torch.rand(1, generator=gen))
    if case != 0 and u < NONE_PROBABILITY:
        return []
    k = int(torch.randint(1, MOST + 1, (1,), generator=gen))
    picked = [POOL[i] for i in torch.randperm(len(POOL), generator=gen)[:k].tolist()]
    if case == 0:  # call A: a drawn pad/bos/eos-like id and a drawn top-of-table id, before the rest
        low, high = POOL[:3], POOL[-3:]
        picked = [low[int(torch.randint(0, 3, (1,), generator=gen))],
                  high[int(torch.randint(0, 3, (1,), generator=gen))]] + picked[: MOST - 2]
    seen, out = set(), []
    for p in picked:
        if p % vocab not in seen:
            seen.add(p % vocab)
            out.append(p)
    return out[:n]


def fill_ids(ids: torch.Tensor, vocab: int, gen: torch.Generator, case: int | None = None) -> list[str]:
    """Write ids in place (drawn on the CPU with a CPU generator: B x S values, then copied to the ids'
    device); returns the labels of the special ids placed."""
    n = ids.numel()
    flat = torch.randint(0, vocab, (n,), generator=gen)
    if n >= vocab:
        flat[:vocab] = torch.arange(vocab)
        placed = ["every id"]
    else:
        specials = draw_specials(vocab, n, case, gen)
        if specials:
            flat[: len(specials)] = torch.tensor([s % vocab for s in specials])
        placed = [label(s) for s in specials]
    flat = flat[torch.randperm(n, generator=gen)]
    ids.copy_(flat.view(ids.shape))
    return sorted(placed)


def repeated_given(spec, resolved, seed: int) -> dict[str, torch.Tensor]:
    """The ids as `given` (Operation.generate) for a set whose ids repeat: drawn out of a pool of a quarter as many
    distinct ids as tokens (each id ~4 times, as frequent tokens repeat in text), so a kernel that scatters per id
    and keeps one of a repeated id's rows shows (the deterministic-mode call, checks/trainer_modes.py)."""
    shape = resolved.shapes["completion_ids"]
    vocab = resolved.axes[spec.input("completion_ids").range.max_exclusive]
    n = math.prod(shape)
    gen = torch.Generator().manual_seed(seed & (2**63 - 1))
    pool = torch.randperm(vocab, generator=gen)[: max(2, min(vocab, n // 4))]
    return {"completion_ids": pool[torch.randint(0, pool.numel(), (n,), generator=gen)].view(shape)}
