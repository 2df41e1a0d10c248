"""The trainer-shaped probe's padded batch (TS-padded, the thirty-sixth session's red-team round): a micro-batch as
a GRPO trainer pads it, every completion right-padded to the longest one, which is one long completion among short
ones: hundreds of rows, a few percent of them kept. The workloads never made one: a masked call on the CPU has at
most ~73 rows, and the reach calls, the only large ones, keep 3/4 of their tokens (`reach_mask`). A kernel taking a
packed (varlen) path for such batches, gathering the kept rows and reading each one's advantage at the wrong
index, passed every default run (`tests/gallery/fused-sparse-mask-packed-advantages`: >= 256 rows, < 1/8 kept).

Once per worker process and member with a mask (what it looks for is a path of the code), at the workload's
vocabulary (on the CPU 61-97 entries) and hidden size and dtypes, with a shape of its own (`checks/shaped.py`): no
compile for another vocabulary or dtype on CUDA, and on the CPU at most 800 rows of at most 97 entries. Judged as the
other trainer-shaped calls (PLAIN: loss and gradient against the reference)."""

from __future__ import annotations

import random

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import PLAIN, WorkloadConformance
from grpo_conform.checks.shaped import at_shape

#: the batch's sequences and the least rows (batch x seq): trainers' micro-batches are 8-64 sequences; 512 rows are
#: past the 256 where the gallery's packed path engages, and past every default workload's rows (~73)
PADDED_BATCH = (16, 20)
PADDED_ROWS = 512
PADDED_SEQ = (33, 40)  # the longest completion (seq): odd lengths among them, the rows off powers of two
#: the vocabulary on the CPU, where the rows cost what the vocabulary does (an interpreted kernel, the float64
#: reference): a packed path's indexing does not depend on it. On CUDA the workload's (no compile for another)
PADDED_VOCAB_CPU = (61, 97)
SHORT = (1, 3)  # the other completions' lengths: EOS early (a refusal, a one-word answer)
#: the kept share's top (12%): 1/B + ~2/seq of the rows, under the 1/8 a packed path for sparse batches keys on
KEPT_MAX = 0.12


def padded_lengths(batch: int, seq: int, r: random.Random) -> tuple[list[int], int]:
    """(each row's kept prefix, the long row): one drawn row the full `seq`, the others SHORT, cut by one token at
    a time (the longest short row first, never below one) until at most KEPT_MAX of the rows are kept."""
    long_row = r.randrange(batch)
    lengths = [seq if b == long_row else r.randint(*SHORT) for b in range(batch)]
    while sum(lengths) > KEPT_MAX * batch * seq:
        b = max((b for b in range(batch) if b != long_row and lengths[b] > 1), key=lambda b: lengths[b], default=None)
        if b is None:
            break
        lengths[b] -= 1
    return lengths, long_row


def padded_batch(run: WorkloadConformance, mask: str, advantages) -> None:
    """TS-padded: a fresh set at a shape of its own, B (16-20) sequences padded to the longest, seq 33-40, rows >=
    512: one drawn completion the full length, the others 1-3 tokens (right-padded prefixes, as a trainer's mask),
    9-12% of the rows kept; advantages group-normalised (`advantages(batch, gen)`), the rest drawn given them.
    How a hostile kernel tells it apart: by its shape, once per member (hundreds of rows, a few percent kept), which
    is what a trainer's padded batch is, so recognising it is being right on that batch. A kernel whose packed path
    engages only past other thresholds (2048+ rows, under 4% kept, batch past 24) passes it: those need a larger
    call than the CPU affords on every member (reach's batch call, 263+ sequences, keeps 3/4)."""
    if run.made_in("padded_batch") is not None:
        return
    r = random.Random(run.seeds[0] ^ 0x9ADB)
    batch = r.randint(*PADDED_BATCH)
    seq = r.randint(max(PADDED_SEQ[0], -(-PADDED_ROWS // batch)), PADDED_SEQ[1])
    lengths, long_row = padded_lengths(batch, seq, r)
    keep = torch.arange(seq).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    free = [a.name for a in run.spec.axes if a.derivation() is None]
    axes = {**{a: run.rw.axes[a] for a in free}, "batch": batch, "seq": seq}
    if run.device.type != "cuda":
        axes["vocab"] = min(axes["vocab"], r.randint(*PADDED_VOCAB_CPU))
    gen = torch.Generator().manual_seed(run.seeds[0] ^ 0x9ADC)
    with at_shape(run, "TP", "TPO", axes) as (inp, out):
        adv = advantages(batch, gen).reshape(inp.tensors["advantages"].shape)
        run.generate(inp, run.seeds[0] ^ 0x9ADD, given={"advantages": adv, mask: keep})
        run.draws["padded_batch"] = {"batch": batch, "seq": seq, "long_row": long_row, "kept": int(keep.sum())}
        call = run.call("TS-padded", inp, out, PLAIN, keep=False)
        if call is not None:
            J.plain(run, call)
