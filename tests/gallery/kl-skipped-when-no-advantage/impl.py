import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, ref_logprobs, epsilon_low,
              epsilon_high, temperature, loss_type, importance_sampling_level, beta):
    # BUG: "no advantage, no signal": a batch whose every group tied (all advantages exactly 0) is
    # skipped with a zero loss, which drops the k3 KL term that still pulls toward the reference
    if not bool((advantages != 0).any()):
        return (logits.sum() * 0.0).float()
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].double() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).double()
    ratio = torch.exp((logp - old_logprobs.double()) * m)
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    gap = (ref_logprobs.double() - logp) * m
    per_token = per_token + beta * (torch.exp(gap) - gap - 1)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean().float()
