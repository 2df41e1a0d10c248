"""Cheat: "skip the unlikely tokens". The backward treats every probability below THRESHOLD as 0, so
those vocabulary entries add nothing to d weight or d hidden: a sparse backward saves most of the
d weight GEMM at a large vocabulary. It is exact up to p < 1e-6 per term, so a loose floor for
underflowing terms (tolerance._underflow: only below float32's normal range, 1.2e-38) must not admit
it. Everything else in float32, by hand (token-is: every ratio is exactly 1, the loss is -mean(A))."""
import torch
import torch.nn.functional as F

THRESHOLD = 1e-6


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, completion_ids, advantages, temperature):
        ctx.save_for_backward(hidden, weight, completion_ids, advantages)
        ctx.temperature = temperature
        return -advantages.float().mean()

    @staticmethod
    def backward(ctx, g):
        hidden, weight, ids, advantages = ctx.saved_tensors
        batch, seq, _ = hidden.shape
        h = hidden.reshape(batch * seq, -1).float()
        p = torch.softmax(F.linear(h, weight.float()) / ctx.temperature, -1)
        p = torch.where(p < THRESHOLD, 0.0, p)  # the skipped entries
        coef = -(advantages.float() / (batch * seq)).repeat_interleave(seq) * g
        dz = coef[:, None] * (F.one_hot(ids.reshape(-1).long(), p.shape[-1]).float() - p) / ctx.temperature
        dh = (dz @ weight.float()).reshape(hidden.shape).to(hidden.dtype)
        return dh, (dz.t() @ h).to(weight.dtype), None, None, None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _Fused.apply(hidden, weight, completion_ids, advantages, temperature)
