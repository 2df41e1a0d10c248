"""Launchers of the staged (Gluon) member kernels for plan.py, CUDA only.

Shapes come from launch.GPU_DEFAULT (rounds 4-6 of docs/triton-kernel-notes.md: 20 KB chunks for
the gradient pass, 32 KB for the statistics-only pass), computed once per plan. If a staged kernel
fails to compile (a Triton version whose Gluon API differs), the failure is caught before anything
ran on the device, staging is switched off for the process (`DISABLED` says why) and the caller
runs the plain kernels instead: slower, never wrong. Both functions return whether they launched.
"""

from __future__ import annotations

import warnings

import torch

from . import fastlaunch, launch

DISABLED: list[str] = []  # the reason staging was switched off, if it was


def _shapes(plan, logits):
    cached = getattr(plan, "_staged_shapes", None)
    if cached is None:
        s = plan.staged
        p = launch.Problem.of(logits, 0.2, 0.2, 1.0)
        main = launch._staged_shape(logits, p, s.stage_bytes, s.block, s.num_warps)
        stats = launch._staged_shape(logits, p, s.forward_stage_bytes, s.forward_block, s.forward_stage_warps)
        n = max(main["NUM_CHUNKS"], stats["NUM_CHUNKS"])
        part = plan.partials
        views = (part[: plan.tokens * n], part[plan.tokens * n : 2 * plan.tokens * n])
        cached = plan._staged_shapes = (main, stats, views, launch.LOG2E * plan.sem.inv_temp)
    return cached


# Masked members walk the grid in sequence order. Position-major (row b, t at b + batch * t, so that
# right padding's write-only rows run beside read + write rows) measured 1-3% slower with 60% or more
# of the tokens unmasked on the H200 (docs/triton-kernel-notes.md, round 10). A module switch so that
# benchmarks/research/mask_probe.py can still time both orders in one process.
INTERLEAVE_MASKED = False


def member_constexprs(sem) -> dict:
    """The switches _staged_member_kernel is launched with for these semantics (plan.Semantics): in
    backward for members whose loss does not read the logits (plan.Plan.deferred), else in forward.
    HEAD (rows off 16-byte boundaries, staged_rows.py) is the shape's, not the member's: the launchers
    set it from plan.staged_head; False here is the aligned kernel every record so far ran."""
    from .plan import kernel_switches

    return dict(kernel_switches(sem), PER_SEQ_W=sem.norm != 0, IN_BACKWARD=not sem.needs_logp and not sem.sequence,
                INTERLEAVE=bool(sem.has_mask and INTERLEAVE_MASKED), HEAD=False)


def stats_constexprs(sem) -> dict:
    """The switches _staged_stats_kernel is launched with."""
    return dict(HAS_MASK=sem.has_mask, HAS_OLD=sem.has_old, HAS_KL=sem.has_kl, HEAD=False)


def _mask_bytes(mask):
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


def _give_up(plan, exc) -> None:
    DISABLED.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    warnings.warn(f"grpo-conform triton: staged kernels disabled, plain kernels used instead ({DISABLED[-1]})")
    plan.staged = None


def main(plan, x, wb, rb, grad, ws, flag, in_backward: bool) -> bool:
    """The member kernel: in the forward `flag` is the plan's flag; in backward (deferred plans) d loss."""
    if DISABLED:
        plan.staged = None
        return False
    logits, ids, adv, old, ref, mask, rho = x
    try:
        from . import staged

        shape, _, (m_part, s_part), scale2 = _shapes(plan, logits)
        key = "main-backward" if in_backward else "main"
        launch_ = plan.l_staged.get(key)
        if launch_ is None:
            launch_ = plan.l_staged[key] = fastlaunch.Launch(
                staged._staged_member_kernel, (plan.rows * shape["NUM_CHUNKS"],),
                dict(**shape, THREAD_STATS=plan.staged.thread_stats,
                     **dict(member_constexprs(plan.sem), IN_BACKWARD=in_backward, HEAD=plan.staged_head)),
                {"num_warps": plan.staged.num_warps}, plan.fast)
        launch_(
            plan.stream, logits, ids, adv, old, ref, _mask_bytes(mask), rho, wb, rb, grad, m_part, s_part,
            plan.counters("staged-main"), ws, flag, plan.tokens, plan.stride_b, plan.stride_t, plan.seq, plan.vocab,
            scale2, *plan.term_args)
        return True
    except Exception as exc:  # compile-time only: nothing reached the device
        _give_up(plan, exc)
        return False


def stats(plan, x, ws) -> bool:
    if DISABLED:
        plan.staged = None
        return False
    logits, ids, _adv, old, ref, mask, _rho = x
    try:
        from . import staged

        _, shape, (m_part, s_part), scale2 = _shapes(plan, logits)
        launch_ = plan.l_staged.get("stats")
        if launch_ is None:
            launch_ = plan.l_staged["stats"] = fastlaunch.Launch(
                staged._staged_stats_kernel, (plan.tokens * shape["NUM_CHUNKS"],),
                dict(**shape, THREAD_STATS=plan.staged.thread_stats,
                     **dict(stats_constexprs(plan.sem), HEAD=plan.staged_head)),
                {"num_warps": plan.staged.forward_stage_warps}, plan.fast)
        launch_(
            plan.stream, logits, ids, _mask_bytes(mask), old, ref, m_part, s_part, plan.counters("staged-stats"), ws,
            plan.tokens, plan.stride_b, plan.stride_t, plan.seq, plan.vocab, scale2, plan.sem.inv_temp, plan.sem.inv_lo)
        return True
    except Exception as exc:
        _give_up(plan, exc)
        return False
