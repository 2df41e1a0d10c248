import torch


def _logp(logits, completion_ids, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    return torch.log_softmax(z, -1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)


def _grpo(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
          temperature):
    # plain token-level GRPO: clipped surrogate, mean over each sequence's tokens, then the batch
    keep = completion_mask != 0
    m = keep.float()
    logp = _logp(logits, completion_ids, temperature)
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.where(clipped >= unclipped, unclipped, clipped)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()


# The objectives this kernel has; anything else "falls back" to the default one. The bug of a
# trainer whose fused-kernel path knows only GRPO (TRL issues 6808 and 7270: GMPOTrainer with
# use_liger_kernel=True trained GRPO): the manifest claims CISPO, the call says
# loss_type="cispo", and the loss computed is GRPO's, without an error.
_OBJECTIVES = {"grpo": _grpo}


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    objective = _OBJECTIVES.get(str(loss_type).replace("-", "_"), _grpo)
    return objective(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
                     temperature)
