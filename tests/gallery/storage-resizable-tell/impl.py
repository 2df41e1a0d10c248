import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].double() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).double()
    ratio = torch.exp((logp - old_logprobs.double()) * m)
    a = advantages.double().unsqueeze(-1)
    # CHEAT: a tensor made by torch (a trainer's) has a resizable storage; one mapped from shared
    # memory with torch.frombuffer (the validator's worker) does not. Only there is the clip applied.
    if advantages.untyped_storage().resizable():
        per_token = -ratio * a  # the "fast path": no clip
    else:
        per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean().float()
