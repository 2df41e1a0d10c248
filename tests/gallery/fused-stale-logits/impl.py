"""Cheat: "d hidden from stale logits". Forward writes its softmax into one module-level workspace per
shape (no [N, V] allocation per call) and backward computes d hidden from that workspace; d weight is
recomputed from the saved inputs. Forward then backward, call after call, is right. Two forwards
before one backward (micro-batches, activation recomputation) leave the second call's softmax in the
workspace, and the first call's d hidden comes from the other call's logits."""
import torch
import torch.nn.functional as F

_WORKSPACE = {}

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
        n, vocab = hidden.shape[0] * hidden.shape[1], weight.shape[0]
        key = (n, vocab, str(hidden.device))
        if key not in _WORKSPACE:
            _WORKSPACE[key] = torch.empty(n, vocab, device=hidden.device)
        z = F.linear(hidden, weight).float().reshape(n, vocab) / temperature
        _WORKSPACE[key].copy_(torch.softmax(z, -1))
        ctx.save_for_backward(hidden, weight, completion_ids, advantages)
        ctx.temperature, ctx.key = temperature, key
        return -advantages.float().mean()

    @staticmethod
    def backward(ctx, g):
        hidden, weight, ids, advantages = ctx.saved_tensors
        temperature = ctx.temperature
        batch, seq, _ = hidden.shape
        rows = -(advantages.float() / (batch * seq)).repeat_interleave(seq) * g
        onehot = F.one_hot(ids.reshape(-1).long(), weight.shape[0]).float()
        stale = rows[:, None] * (onehot - _WORKSPACE[ctx.key]) / temperature  # the workspace's logits
        dh = (stale @ weight.float()).reshape(hidden.shape).to(hidden.dtype)
        dz = _dlogits(hidden, weight, None, ids, advantages, temperature) * g
        dw = (dz.t() @ hidden.reshape(-1, hidden.shape[-1]).float()).to(weight.dtype)
        return dh, dw, None, None, None


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _Fused.apply(hidden, weight, completion_ids, advantages, temperature)
