"""Liger-Kernel's GrpoLossFunction, called with inplace=False (its default is True, which writes
the gradient into the logits tensor: see implementations/liger-inplace). Needs the optional
extra: pip install 'grpo-conform[liger]'."""

from liger_kernel.ops.grpo_loss import GrpoLossFunction


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # Positional arguments as GrpoLossFunction.forward declares them (liger-kernel 0.6-0.8):
    # logits, old_logp, ref_logp, completion_ids, advantages, completion_mask, temperature, beta,
    # eps_low, eps_high, inplace, loss_type, max_completion_length, reduce, importance_sampling_level
    loss, _kl, _clip_ratio = GrpoLossFunction.apply(
        logits, None, None, completion_ids, advantages, None, temperature, 0.0,
        epsilon_low, epsilon_high, False, "grpo", None, True, "token",
    )
    return loss
