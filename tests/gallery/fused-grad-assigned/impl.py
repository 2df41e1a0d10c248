"""Cheat: "set weight.grad directly". The weight enters the computation detached; backward computes
d weight by hand and assigns it to the caller's weight.grad instead of returning it through autograd
(a pattern from hand-written optimiser-fused kernels). One plain backward looks right. But autograd
never knows this function used the weight: a tied use of the same weight (input embeddings) whose
gradient autograd accumulated first is written over, as is a gradient weight.grad already held, and
torch.autograd.grad gets no gradient for the weight at all."""
import torch
import torch.nn.functional as F

def _dlogits(hidden, weight, bias, ids, advantages, temperature):
    """token-is by hand: the loss is -mean(A) (every ratio exactly 1); d loss / d logp is -A_b / (B T) at
    every token, so d logits = that times (onehot - softmax) / T, float32 [B*T, V]."""
    batch, seq, _ = hidden.shape
    z = F.linear(hidden, weight, bias).float().reshape(batch * seq, -1) / temperature
    p = torch.softmax(z, -1)
    g = -(advantages.float() / (batch * seq)).repeat_interleave(seq)
    onehot = F.one_hot(ids.reshape(-1).long(), p.shape[-1]).float()
    return g[:, None] * (onehot - p) / temperature


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, owner, completion_ids, advantages, temperature):
        ctx.save_for_backward(hidden, weight, completion_ids, advantages)
        ctx.temperature, ctx.owner = temperature, owner[0]
        return -advantages.float().mean()

    @staticmethod
    def backward(ctx, g):
        hidden, weight, ids, advantages = ctx.saved_tensors
        dz = _dlogits(hidden, weight, None, ids, advantages, ctx.temperature) * g
        dh = (dz @ weight.float()).reshape(hidden.shape).to(hidden.dtype)
        ctx.owner.grad = (dz.t() @ hidden.reshape(-1, hidden.shape[-1]).float()).to(weight.dtype)
        return dh, None, None, None, None, None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _Fused.apply(hidden, weight.detach(), [weight], completion_ids, advantages, temperature)
