import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # Takes the mask and never uses it: padded positions count as tokens and get a gradient.
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - old_logprobs.float())
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean()
