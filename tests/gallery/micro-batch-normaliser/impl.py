import torch


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level, num_items_in_batch, num_processes):
    # dapo as a per-process kernel computes it (Liger-Kernel issue 1082): the normaliser is the
    # all-reduced token count of the micro-batch over the world size, which on one process is
    # this micro-batch's own mask sum. TRL's dapo divides by the generation batch's token count
    # per process, given here as num_items_in_batch / num_processes: the same only when every
    # micro-batch holds exactly its share of the tokens. Everything else is right.
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
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    local_tokens = m.sum()  # all_reduce(m.sum()) / world_size, on one process
    return per_token.sum() / local_tokens.clamp(min=1.0)
