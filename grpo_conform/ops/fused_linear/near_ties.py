"""Near ties for grpo-fused-linear (`Operation.near_tie_inputs`, the `near-ties` probe's call T-near).

The logits operation builds rows whose log-prob every float32 kernel computes exactly (`tie_rows`), so its
ratios can sit 1e-5 from a clip bound. Here the log-probs come out of the lm_head GEMM, which an honest
implementation may round to the operands' dtype on the way (torch's bf16 `linear` does): the allowance
(`tolerance.py`) lets a ratio within d_r ~ u * |z| of a bound fall on either side. Drawn heads give logits
of std ~1 (rows of the `large` profile ~1e3, a bias ~N(0, 1)), where d_r in bfloat16 (~5e-3) covers the
whole band in which a ratio rounded to bfloat16 flips its branch (up to 3.3e-3 at 1.2). A kernel picking
the branch from a bf16 ratio therefore passed every fused check (the thirty-fifth session's round,
docs/checks.md).

So the call first quiets the logits: each hidden row (and each reference hidden row) is scaled by a power
of two (exact) until its logits' RMS over a sample of the vocabulary, divided by the temperature, is at
most QUIET_RMS, and the bias likewise as a whole. d_r then drops to ~1e-4 in bfloat16, and every live token
is placed at least FLOOR_FACTOR times its own d_r from its bound, up to NEAR_MAX (`near_old_logprobs`):
an honest kernel's ratio lies on the reference's side of every such token, while a ratio rounded to
bfloat16 still crosses on those within its rounding band (`tests/test_near_ties.py`).

Hostile angle: the inputs are an ordinary input set with quiet logits (a model's early, near-uniform
steps); telling them apart needs the logits, and a kernel that computes them could as well keep the ratio
in float32. A kernel that switches precision on the logits' magnitude is written down in docs/checks.md.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from grpo_conform.ops.fused_linear.reference import row_stats
from grpo_conform.ops.fused_linear.tolerance import logprob_allowance
from grpo_conform.ops.grpo_logits.generators.near_ties import (mix_signs, near_old_logprobs, near_record,
                                                                sequence_floor)
from grpo_conform.ops.grpo_logits.member_inputs import tie_ref_logprobs
from grpo_conform.ops.grpo_terms import GrpoParameters
from grpo_conform.spec import Spec

QUIET_RMS = 2.0**-6  # logits / T: d_r in bfloat16 ~ 2^-8 * |z| ~ 1e-4, far under the bf16 ratio band
FLOOR_FACTOR = 2.0  # each token at least this many times its own log-prob allowance from its bound
SAMPLE_VOCAB = 1024  # vocabulary rows the logits' RMS is estimated over (the target's always among them)
_SALT = 0x6E6671  # "nfq"


def _shrink(rms: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per entry the power of two 2^-k (k >= 0) that brings rms / T to at most QUIET_RMS."""
    ratio = (rms / (QUIET_RMS * temperature)).clamp_min(1.0)
    return torch.exp2(-torch.ceil(torch.log2(ratio)))


def _quiet_rows(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float,
                gen: torch.Generator) -> torch.Tensor:
    """`hidden` with each row scaled by a power of two so that its logits (bias left out) have an RMS of at
    most QUIET_RMS * T over SAMPLE_VOCAB vocabulary rows and its own target."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    vocab = weight.shape[0]
    cols = torch.randperm(vocab, generator=gen)[:SAMPLE_VOCAB].to(weight.device)
    w = weight[cols].to(torch.float64)
    sq = torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)
    step = max(1, 2**24 // max(1, w.shape[0]))
    target = ids.reshape(-1).to(weight.device, torch.int64)
    for r0 in range(0, flat.shape[0], step):
        h = flat[r0:r0 + step].to(torch.float64)
        z = h @ w.T
        own = (h * weight[target[r0:r0 + step]].to(torch.float64)).sum(-1)
        sq[r0:r0 + step] = (z.square().sum(-1) + own.square()) / (w.shape[0] + 1)
    scale = _shrink(sq.sqrt(), temperature).to(flat.dtype)
    return (flat * scale[:, None]).reshape(hidden.shape)


def quiet_logits(tensors: Mapping[str, torch.Tensor], p: GrpoParameters,
                 gen: torch.Generator) -> dict[str, torch.Tensor]:
    """New hidden (and ref_hidden, bias, ref_bias where given) for quiet logits: each hidden row scaled by a power of
    two (exact) until its logits' RMS / T is at most QUIET_RMS (`_quiet_rows`), each bias as a whole likewise. The
    log-prob allowance of a GEMM in the operands' dtype shrinks with the logits (`Operation.quiet_inputs`)."""
    t = float(p.temperature)
    ids = tensors["completion_ids"]
    out = {"hidden": _quiet_rows(tensors["hidden"], tensors["weight"], ids, t, gen)}
    if "ref_hidden" in tensors and "ref_weight" in tensors:
        out["ref_hidden"] = _quiet_rows(tensors["ref_hidden"], tensors["ref_weight"], ids, t, gen)
    for name in ("bias", "ref_bias"):
        if tensors.get(name) is not None:
            b = tensors[name]
            rms = b.to(torch.float64).square().mean().sqrt().reshape(1)
            out[name] = b * _shrink(rms, t).to(b.dtype)
    return out


def quiet_inputs(tensors: Mapping[str, torch.Tensor], p: GrpoParameters, seed: int) -> dict[str, torch.Tensor]:
    """`quiet_logits` drawn from `seed` (`Operation.quiet_inputs`)."""
    return quiet_logits(tensors, p, torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1)))


def near_tie_inputs(spec: Spec, tensors: Mapping[str, torch.Tensor], p: GrpoParameters, seed: int,
                    record: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A copy of `tensors` with quiet logits (module docstring) whose live tokens' ratios sit at their bound
    times (1 + d), |d| from FLOOR_FACTOR times the token's log-prob allowance (at least NEAR_MIN) to NEAR_MAX;
    `record` gets the distances, the scaling and how many live tokens lie beyond their allowance."""
    out = {k: v.clone() for k, v in tensors.items()}
    gen = torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1))
    ids = out["completion_ids"]
    out.update(quiet_logits(out, p, gen))
    mix_signs(out, seed)
    logp = row_stats(out, p).logp.reshape(ids.shape).cpu()
    allowed = logprob_allowance(out, p)
    floor = None if allowed is None else FLOOR_FACTOR * allowed
    if floor is not None and p.importance_sampling_level == "sequence":  # the mean of its tokens' errors
        floor = sequence_floor(floor, out["completion_mask"].cpu() != 0 if "completion_mask" in out
                               else torch.ones_like(floor, dtype=torch.bool))
    old = near_old_logprobs(logp, out["advantages"], p, gen, floor).to(torch.float32)
    out["old_logprobs"].copy_(old.to(out["old_logprobs"].device, out["old_logprobs"].dtype))
    if "ref_logprobs" in out:  # the KL term's gap away from 0, on the advantage's side
        tie_ref_logprobs(spec, out, gen, logp)
    near_record(logp, out, p, record, allowed)
    if allowed is not None:
        record["max_allowance"] = float(allowed.max()) if allowed.numel() else 0.0
    record["quiet_rms"] = QUIET_RMS
    return out

