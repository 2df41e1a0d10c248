"""The `one-input` probe of the GRPO family: calls that each change one input only, at its end.

Every other probe that reuses an input set either changes the advantages or no values at all, and each new
set is a fresh draw whose first elements differ too. So a result cache keyed on the shapes, the parameters,
the advantages and the first few elements of hidden and weight (or of the logits) was never hit with a
stale key: it passed every default run of the twenty-seventh session's adversarial round
(`tests/gallery/fused-cache-by-prefix`). In a trainer such keys collide: two micro-batches of one prompt
group share their first hidden states, and binary rewards repeat their advantages.

Here V0 calls a fresh set, then each input in turn is changed in place at its end (its last two rows
of features, or its last two elements, swapped; a mask's last kept token masked; a token id moved to the next
id where the two are equal) and called again (V-<input>#n): the results must follow the inputs (`freshness`).
Once per worker process and member, like repeated-calls: a cache is a property of the process. grpo-fused-linear
only (`applies`): grpo-logits' own probes change parts of one set, and its junk rows make a swap unsafe.
"""

from __future__ import annotations

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, Probe, WorkloadConformance

#: the axes whose entries are one row's features: an input ending in one of them changes by whole rows
FEATURE_AXES = ("hidden", "vocab")


def change_end(t: torch.Tensor, kind: str, feature_rows: bool, vocab: int | None) -> bool:
    """Change `t` in place at its end; False when nothing could change (a single element that a swap keeps)."""
    if t.numel() == 0:
        return False
    if kind == "mask":  # the last kept token masked (never one unmasked: a masked row may hold any values)
        flat = t.view(-1)
        kept = (flat != 0).nonzero()
        if kept.numel() == 0:
            return False
        flat[int(kept[-1])] = 0
        return True
    rows = t.view(-1, t.shape[-1]) if feature_rows and t.dim() >= 2 else t.view(-1, 1)
    if rows.shape[0] >= 2 and not torch.equal(rows[-1], rows[-2]):
        last = rows[-1].clone()
        rows[-1] = rows[-2]
        rows[-2] = last
        return True
    if t.dtype in (torch.int64, torch.int32):  # token ids: the next id (a valid one)
        rows[-1] = (rows[-1] + 1) % (vocab or int(rows[-1].max()) + 2)
        return True
    rows[-1] = rows[-1] * -1.25 - 0.125  # equal or lone floats (an advantage of a batch of 1)
    return True


def one_input(run: WorkloadConformance) -> None:
    """V0, then one call per input with only that input changed at its end (in place): results follow."""
    if run.made_in("one_input") is not None:  # freshness is fed by other probes too: nothing to mark
        return
    P = run.P
    run.generate(P, run.seeds[0] ^ 0x0131)  # a set of its own, not what earlier probes left in P
    vocab = run.rw.axes.get("vocab")
    changed: list[str] = []
    run.draws["one_input"] = changed
    first = run.call("V0", P, run.out1, CALL + ("freshness",))
    if first is None:
        return
    J.fresh(run, first, "a fresh set, before its inputs change one at a time")
    for spec_input in run.spec.inputs:
        name = spec_input.name
        feature_rows = bool(spec_input.shape) and spec_input.shape[-1] in FEATURE_AXES
        if name not in P.tensors or not change_end(P.tensors[name], run.op.input_kind(name), feature_rows, vocab):
            continue
        P.commit()
        changed.append(name)
        call = run.call(f"V-{name}", P, run.out1, CALL + ("freshness",))
        if call is not None:
            J.fresh(run, call, f"only {name} changed, at its end, in place")


def _without_given_logits(spec) -> str | None:
    if any(a.name == "seq_next" for a in spec.axes):
        return ("grpo-logits: row-locality and masked-positions change parts of one set there; its left-over position "
                "and masked rows hold values that a swap at the end would move into kept ones")
    return None


ONE_INPUT = Probe("one-input", one_input.__doc__, one_input, CALL + ("freshness",), applies=_without_given_logits)
