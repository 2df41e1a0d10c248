"""Liger-Kernel's GrpoLossFunction with its default inplace=True: backward writes d loss / d logits
into the logits tensor's storage. Bundled to show the validator catching a real kernel that
mutates its input: it must fail the no-mutation check. Needs: pip install 'grpo-conform[liger]'."""

from liger_kernel.ops.grpo_loss import GrpoLossFunction


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    loss, _kl, _clip_ratio = GrpoLossFunction.apply(
        logits, None, None, completion_ids, advantages, None, temperature, 0.0,
        epsilon_low, epsilon_high, True, "grpo", None, True, "token",
    )
    return loss
