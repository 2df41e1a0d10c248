import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, ref_logprobs, epsilon_low,
              epsilon_high, temperature, loss_type, importance_sampling_level, beta):
    # k3 KL with the gap ref - logp clamped to [-10, 10]: exact wherever the reference policy stays
    # within 10 nats of the policy, no gradient (and a capped value) beyond.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = torch.where(clipped <= unclipped, unclipped, clipped)
    d = torch.clamp(torch.where(keep, ref_logprobs.float(), logp.detach()) - logp, min=-10.0, max=10.0)
    per_token = per_token + beta * (torch.exp(d) - d - 1.0)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
