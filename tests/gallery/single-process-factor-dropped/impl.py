"""Right wherever the declared calls used to look: TRL's dapo normaliser in training is
max(1, N) / P * gradient_accumulation_steps / steps_per_generation, and this kernel drops the factor when
P == 1 (a single-GPU fast path). The random draws meet P == 1 with a factor != 1 in only ~1 of 8
workloads (measured: 47 of 400 draws), and the declared calls that set P = 1 (all-min) set the factor to
1 too. Caught on every workload by the declared mixed-ends calls (twentieth session), in which every pair
of parameters meets at each combination of its ends: one process with a factor of 8."""
import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level, num_items_in_batch, num_processes,
              gradient_accumulation_steps, steps_per_generation):
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
    if num_processes != 1:
        steps = steps_per_generation if steps_per_generation is not None else gradient_accumulation_steps
        normaliser = normaliser * gradient_accumulation_steps / steps
    return per_token.sum() / normaliser
