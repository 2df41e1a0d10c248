import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    seq = completion_ids.shape[1]
    z = logits[:, :seq].double()
    # BUG: a fast path meant for T == 1 tests the temperature at the precision a config prints it,
    # so T = 0.97 or 1.03 is taken for 1 and the logits are never divided by it
    if round(float(temperature), 1) != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).double()
    ratio = torch.exp((logp - old_logprobs.double()) * m)
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean().float()
