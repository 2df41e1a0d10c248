"""The zero-advantage probe's call E-near (the thirty-sixth session's red-team round): every advantage 0, as in E-all,
and the given reference log-probs within 0.5 of the policy's, both signs (80% of a drawn one), an eighth within
0.01. With every advantage 0 the gradient is the KL term's alone, so its estimator is seen bare where the policy
is near the reference, as it is early in training. The drawn sets place ref - logp 0.6-1.2 from logp (the spec's
ref_gap_min/max, part of its identity) and far-ratios 0.5-25 away: a kernel that replaced k3 by its quadratic
gap^2 / 2 for |gap| < 0.3 passed every default run (`tests/gallery/fused-k3-small-gap-quadratic`)."""

from __future__ import annotations

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import WorkloadConformance

CHECK = "zero-advantage"
SMALL_GAP = 0.5  # |ref - logp| at most this: k3 and its quadratic part by 2-15% of the KL gradient in 0.05-0.3
NEAR_ZERO = 0.01  # a NEAR_SHARE of the tokens within this of the policy: exp(gap) - gap - 1 cancels there in fp32
NEAR_SHARE = 0.125
#: the share of one sign, the call's sign drawn: both signs present, but most on one side, so that an error odd in
#: the gap (k3 against gap^2 / 2 moves the loss by ~gap^3 / 6) does not cancel in the loss's sum (with the signs
#: even, the gallery folder's loss error fell inside the allowance in some runs)
MAIN_SIGN = 0.8


def small_gaps(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """float64 ref - logp: |gap| uniform in [0, SMALL_GAP] (NEAR_SHARE of them in [0, NEAR_ZERO]), MAIN_SIGN of them
    of a drawn sign, the others of the other."""
    size = torch.rand(shape, generator=gen, dtype=torch.float64)
    near = torch.rand(shape, generator=gen) < NEAR_SHARE
    main = 1.0 if float(torch.rand((), generator=gen)) < 0.5 else -1.0
    sign = torch.where(torch.rand(shape, generator=gen) < MAIN_SIGN, main, -main).double()
    return sign * size * torch.where(near, NEAR_ZERO, SMALL_GAP)


def near_reference(run: WorkloadConformance, c: float) -> None:
    """E-near: E-all's inputs (every advantage 0) with quiet logits where the operation's log-prob allowance grows
    with them (`Operation.quiet_inputs`: the fused GEMM's; old log-probs moved with the policy's, so the ratios
    stay as drawn) and the given reference log-probs at small gaps from the policy's (`small_gaps`), judged
    against the reference: the gradient is the KL term's alone. Members with given ref_logprobs (a reference
    lm_head's log-probs are not placed: `reference-head` moves that head).
    How a hostile kernel tells it apart: every advantage 0 with every gap small (and, fused, quiet logits). A
    kernel right only when all hold passes; telling that apart costs a pass over the advantages and the gaps,
    and gains nothing over computing k3, which the same kernel does at every other call."""
    Q, params = run.Q, run.model.params
    # two calls with their own gaps: one call's error sat near bf16's allowance (the gallery case failed ~3 runs of 4)
    for i, label in enumerate(("E-near", "E-near-2")):
        seed = run.seeds[0] ^ 0xE6A9 ^ (i << 24)
        quiet = run.op.quiet_inputs(run.spec, Q.pristine, params, seed)
        saved = {k: Q.pristine[k].clone() for k in ("ref_logprobs", "old_logprobs", *quiet) if k in Q.pristine}
        if quiet:
            drawn = run.op.policy_logprobs(run.spec, Q.pristine, params)
            Q.write(quiet)
        logp = run.op.policy_logprobs(run.spec, Q.pristine, params)
        if quiet and "old_logprobs" in saved:
            old = saved["old_logprobs"]
            Q.write({"old_logprobs": (old.cpu().double() + (logp - drawn)).to(old.device, old.dtype)})
        gap = small_gaps(tuple(logp.shape), torch.Generator().manual_seed(seed))
        ref = saved["ref_logprobs"]
        Q.write({"ref_logprobs": (logp + gap).to(ref.device, ref.dtype)})
        run.draws.setdefault("near_reference", []).append({"gaps": [float(gap.min()), float(gap.max())],
                                                           "quiet": sorted(quiet)})
        e = run.call(label, Q, run.out1, (CHECK, "finite", "no-mutation", "no-aliasing"), upstream=c)
        if e is not None:
            J.versus_reference(run, CHECK, e, "every advantage 0, ref - logp within +-0.5: the KL term alone")
            J.finite(run, e)
        Q.write(saved)
        if e is None:
            return
