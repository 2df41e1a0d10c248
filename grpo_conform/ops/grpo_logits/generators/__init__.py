"""Input generators keyed by the KIND of an input, not by its name (issue 27, item 2).

A kind is what a generator needs to know to draw values that look like a trainer's: a completion
mask, token ids, a per-sequence scalar (advantages), per-token log-probs. Each kind has its own
module here with a layout vocabulary (mask layouts, advantage cases, special-id subsets, log-prob
gaps) and returns what it covered, so the workload's `draws` can list it. `INPUT_KINDS` maps the
family's input names to kinds in one place; when operations become plug-ins (issue 30) the kind
moves into the operation's input declaration and these modules move behind it unchanged.

`case`: the index of an input set among the sets a workload generates (0 = the first, call A).
Generators rotate their layouts with it, so every layout appears within the first few sets of
every workload whatever its batch (a batch of 1 or 2 has too few rows to hold every layout in one
call). `case=None` (timed calls, tests) draws the layout from the seed alone.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["logits", "token-ids", "sequence-scalar", "mask", "token-logprobs", "token-ratio"]

INPUT_KINDS: dict[str, Kind] = {
    "logits": "logits",
    "completion_ids": "token-ids",
    "advantages": "sequence-scalar",
    "completion_mask": "mask",
    "old_logprobs": "token-logprobs",
    "ref_logprobs": "token-logprobs",
    "sampling_ratio": "token-ratio",
}


def kind_of(name: str) -> Kind:
    """The kind of a declared input; an input without one has no generator (a clear error)."""
    try:
        return INPUT_KINDS[name]
    except KeyError:
        raise KeyError(f"input {name!r} has no declared kind: add it to grpo_conform.ops.grpo_logits.generators.INPUT_KINDS "
                       f"(one of {sorted(set(INPUT_KINDS.values()))}) or declare its generator") from None
