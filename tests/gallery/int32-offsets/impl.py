import torch


class _Int32Offsets(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, temperature):
        ctx.save_for_backward(logits, ids, adv)
        ctx.temperature = temperature
        return (-adv.float()).mean()

    @staticmethod
    def backward(ctx, d_loss):
        logits, ids, adv = ctx.saved_tensors
        b, s1, v = logits.shape
        seq = s1 - 1
        grad = torch.zeros_like(logits)
        for i in range(b):  # the softmax part per sequence (right)
            coef = (adv[i].float() * d_loss / (b * seq * ctx.temperature))
            grad[i, :seq] = (coef * torch.softmax(logits[i, :seq].float() / ctx.temperature, -1)).to(grad.dtype)
        # The one-hot part through flat offsets computed in int32, as a kernel with int32 pointer
        # arithmetic would: they wrap once the logits pass 2^31 elements.
        rows = torch.arange(b, device=ids.device, dtype=torch.int32).view(b, 1) * s1 + \
            torch.arange(seq, device=ids.device, dtype=torch.int32).view(1, seq)
        offsets = (rows * v + ids.to(torch.int32)).to(torch.int64) % grad.numel()
        coef = (adv.float() * d_loss / (b * seq * ctx.temperature)).view(b, 1).expand(b, seq)
        flat = grad.view(-1)
        flat.index_put_((offsets.reshape(-1),), (-coef).reshape(-1).to(grad.dtype), accumulate=True)
        return grad, None, None, None


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _Int32Offsets.apply(logits, completion_ids, advantages, temperature)
