"""The shared-inputs probe (SI-<input>): one tensor passed for two inputs, as trainers hand them over.

Every call gave each input a buffer of its own, so a kernel that looks at what its inputs share passed every
default run while wrong there (forty-second session's red team): with `ref_logprobs` the very tensor of
`old_logprobs` (a trainer's first step, or one that passes the rollout's log-probs for both), a KL term taken as
the reversed k3 of the log-ratio it already had (`kl-ref-aliases-old-reverse-k3`). The fused operation's
`ref_hidden` as `hidden`'s own tensor needs a reference head far from the policy's to be heard, so it is the
reference-head probe's RA-same call (`fused-ref-hidden-aliased-policy-head`), as `ref_weight` as `weight` is its RS.

Which inputs: every pair of the member's inputs of one value kind (`KINDS`: log-probs; the spec
declares shapes and dtypes but not what values mean, and a sampling ratio or a mask of the log-probs' shape and
dtype cannot hold log-probs) that this set holds in the same shape and dtype, the later passed as the earlier's own
tensor ("object"). The pair's values are made equal first (the later takes the earlier's), so the reference judges
exactly what the kernel is handed; equal values are inside every declared domain (the old and reference log-probs
are independent inputs). A new input named by a kind's suffix joins its pairs without a change here.

Once per worker process and member (a property of the code, not of one workload), on a set of its own drawn from
the workload's generator; judged as the other calls (PLAIN: loss and gradients against the reference).
"""

from __future__ import annotations

from typing import Any

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, PLAIN, Probe, WorkloadConformance

#: value kinds, by the suffix of an input's name: inputs of one kind (and one shape and dtype) can hold equal values
KINDS = {"logprobs": "log-probs"}
SALT = 0x5A4ED


def _kind(name: str) -> str | None:
    return next((k for k in KINDS if name.endswith(k)), None)


def shared_pairs(spec: Any, tensors: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) for every pair of the member's inputs of one kind held in the same shape and dtype, in the
    spec's order, the target the later one; each target once (its first source)."""
    names = [t.name for t in spec.inputs if t.name in tensors and _kind(t.name)]
    pairs, taken = [], set()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x, y = tensors[a], tensors[b]
            if b not in taken and _kind(a) == _kind(b) and x.shape == y.shape and x.dtype == y.dtype:
                pairs.append((a, b))
                taken.add(b)
    return pairs


def _applies(spec: Any) -> str | None:
    kinds = [(_kind(t.name), tuple(t.shape)) for t in spec.inputs if _kind(t.name)]
    if len(kinds) > len(set(kinds)):
        return None
    return "no two inputs of the member hold values of one kind (" + ", ".join(KINDS.values()) + ")"


def shared_inputs(run: WorkloadConformance) -> None:
    """SI-<target>: a fresh set with `target` holding `source`'s values, passed as `source`'s own tensor."""
    if run.made_in("shared_inputs") is not None:
        return
    P = run.P
    run.generate(P, run.seeds[0] ^ SALT)
    pairs = shared_pairs(run.spec, P.tensors)
    run.draws["shared_inputs"] = [list(p) for p in pairs]
    for source, target in pairs:
        P.tensors[target].copy_(P.tensors[source])
        P.commit()
        call = run.call(f"SI-{target}", P, run.out1, PLAIN + CALL, same={target: [source, "object"]})
        if call is not None:
            J.plain(run, call)
        run.generate(P, run.seeds[0] ^ SALT)  # the next pair from the drawn set again


SHARED_INPUTS = Probe("shared-inputs", shared_inputs.__doc__, shared_inputs, PLAIN + CALL, applies=_applies)
