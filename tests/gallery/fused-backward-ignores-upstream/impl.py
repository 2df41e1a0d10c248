"""Cheat: "the work moved into forward". As Liger's fused path does, forward computes d hidden and
d weight chunk by chunk and saves them; backward should multiply them by the upstream gradient, and
this one hands them back as they are. A benchmark's loss.backward() (upstream 1) cannot tell; loss
scaling, gradient accumulation's 1/k and a weighted second loss term can."""
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
    def forward(ctx, hidden, weight, completion_ids, advantages, temperature):
        dz = _dlogits(hidden, weight, None, completion_ids, advantages, temperature)
        ctx.dh = (dz @ weight.float()).reshape(hidden.shape).to(hidden.dtype)
        ctx.dw = (dz.t() @ hidden.reshape(-1, hidden.shape[-1]).float()).to(weight.dtype)
        return -advantages.float().mean()

    @staticmethod
    def backward(ctx, g):
        return ctx.dh, ctx.dw, None, None, None  # g never used


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _Fused.apply(hidden, weight, completion_ids, advantages, temperature)
