"""The autograd.Function of the fused op: forward forms the loss and, when a gradient is wanted, every
gradient (the d logits of a chunk die with it); backward only applies the upstream scalar.

forward: FusedPlan.run with the plan's predicted d loss folded into d logits (so into every gradient).
backward: the real d loss; where it differs from the folded one, one in-place rescale of the
gradients (decided on the device: no host synchronisation); the next forward predicts this d loss.
The gradients are handed over and forgotten (nothing is held after backward). A second backward
through a retained graph recomputes everything from the saved inputs with its d loss folded in.
"""

import torch


class FusedLinearGrpoFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, plan, inputs):
        need = tuple(ctx.needs_input_grad[:3])
        result = plan.run(inputs, need)
        ctx.plan, ctx.inputs, ctx.need = plan, inputs, need
        ctx.grads, ctx.c_used = result.grads, result.c_used
        ctx.shape = hidden.shape
        return result.loss

    @staticmethod
    def backward(ctx, dloss):
        plan = ctx.plan
        if ctx.grads is not None:
            grads, ctx.grads = ctx.grads, None  # handed to the caller: never touched again
            plan.rescale(grads, ctx.c_used, dloss)
        else:  # retain_graph: a second backward
            grads = plan.run(ctx.inputs, ctx.need, c=dloss).grads
        plan.observe(dloss)
        gh, gw, gb = grads
        return (None if gh is None else gh.view(ctx.shape)), gw, gb, None, None
