"""The autograd.Function: gradient computed in the forward pass when it will be needed.

When logits require grad, forward runs the fused kernel (loss and gradient in one pass over the
logits) and keeps the gradient; backward multiplies it by d loss in place with a kernel that
reads d loss on the device and exits at once when it is 1 (the usual `loss.backward()`), so no
host synchronisation and no second pass. impl.py calls it only when a graph will be built
(grad mode on and logits requiring grad); otherwise it runs the loss-only kernel.
A second backward through the same graph (retain_graph=True) recomputes the gradient from the
saved per-token row statistics (max, ln S), since the first one consumed the buffer.
"""

import torch

from . import launch


class GrpoLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, completion_ids, advantages, problem, settings):
        loss, grad, stats = launch.fused_loss_and_grad(logits, completion_ids, advantages, problem, settings)
        ctx.save_for_backward(logits, completion_ids, advantages, stats)
        ctx.grad = grad
        ctx.problem, ctx.settings = problem, settings
        return loss

    @staticmethod
    def backward(ctx, dloss):
        dloss = dloss.to(torch.float32).contiguous()
        if ctx.grad is not None:
            grad, ctx.grad = ctx.grad, None  # handed to the caller: never touched again
            launch.scale_in_place(grad, dloss)
        else:
            logits, ids, adv, stats = ctx.saved_tensors
            grad = launch.grad_from_stats(logits, ids, adv, stats, dloss, ctx.problem, ctx.settings)
        return grad, None, None, None, None
