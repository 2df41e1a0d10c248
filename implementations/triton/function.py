"""The autograd.Function: one plan (plan.py), a forward that decides on the device where the gradient
is written, a backward that is correct whatever the forward decided.

forward: Plan.forward_full. Its main kernel reads the plan's flag: 0 (the last backward received
d loss = 1, or none ran yet) writes the gradient in the same pass as the loss; 1 saves the row
statistics and leaves the gradient to backward. backward: Plan.backward, one kernel that reads
the mode this forward stored and d loss on the device: gradient from the statistics times d loss,
or the forward's gradient scaled in place when d loss != 1 (nothing when it is 1), and records
for the next forward whether d loss was 1. No host synchronisation anywhere.
A second backward through the same graph (retain_graph=True) recomputes the gradient from the
saved statistics into a new buffer (the first was handed to the caller).
"""

import torch


class GrpoLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, plan, others):
        x = (logits,) + others
        loss, grad, ws = plan.forward_full(x)
        # every input through save_for_backward, none kept on ctx: autograd then raises where a caller rewrote one in
        # place before backward, which reads them again (the check rewritten-inputs; a tuple on ctx read the new values)
        ctx.save_for_backward(logits, *others)
        ctx.plan, ctx.grad, ctx.ws = plan, grad, ws
        return loss

    @staticmethod
    def backward(ctx, dloss):
        x = tuple(ctx.saved_tensors)
        plan = ctx.plan
        if ctx.grad is not None:
            grad, ctx.grad = ctx.grad, None  # handed to the caller: never touched again
            return plan.backward(x, grad, ctx.ws, dloss, force_stats=False), None, None
        grad = torch.empty(plan.grad_shape, dtype=plan.dtype, device=plan.device)
        return plan.backward(x, grad, ctx.ws, dloss, force_stats=True), None, None
