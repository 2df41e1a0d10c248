import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].double() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).double()
    ratio = torch.exp((logp - old_logprobs.double()) * m)
    a = advantages.double().unsqueeze(-1)
    lo, hi = 1 - epsilon_low, 1 + epsilon_high
    value = -torch.minimum(ratio * a, torch.clamp(ratio, lo, hi) * a)  # the forward: exact
    # BUG: the backward's clip mask is recomputed from the ratio as saved for backward, in the logits'
    # dtype (a memory saving): in bf16 a ratio in (1.1992, 1.2) rounds to 1.203125 and counts as clipped
    saved = ratio.detach().float().to(logits.dtype).double()
    clipped = ((a > 0) & (saved > hi)) | ((a < 0) & (saved < lo))
    live = -(ratio * a)
    per_token = value.detach() + (live - live.detach()) * (~clipped).double()
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean().float()
