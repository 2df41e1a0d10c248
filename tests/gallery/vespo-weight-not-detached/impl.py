import math

import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level, vespo_k_pos, vespo_lambda_pos, vespo_k_neg,
              vespo_lambda_neg):
    # VESPO's weight computed with its gradient (no torch.no_grad, no detach): same value, wrong gradient.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    log_ratio = torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp))
    adv = advantages.float().unsqueeze(-1)
    u = (log_ratio.clamp(-20.0, 20.0) * m).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
    k = torch.where(adv >= 0, torch.full_like(adv, vespo_k_pos), torch.full_like(adv, vespo_k_neg))
    lam = torch.where(adv >= 0, torch.full_like(adv, vespo_lambda_pos), torch.full_like(adv, vespo_lambda_neg))
    phi = torch.exp(lam + k * u - lam * torch.exp(u))
    per_token = -phi * adv * logp
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return per_token.sum() / m.sum().clamp(min=1.0)
