import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    # A kernel that takes the mask as lengths (one int per row, what varlen kernels want) and
    # rebuilds it as right padding: right for TRL's right-padded completions, wrong for left
    # padding and for masks with interior holes (tool outputs).
    seq = completion_ids.shape[1]
    lengths = (completion_mask != 0).sum(-1, keepdim=True)
    keep = torch.arange(seq, device=completion_ids.device).unsqueeze(0) < lengths
    m = keep.float()
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = torch.where(clipped <= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
