"""Wrong: GSPO (importance_sampling_level "sequence") with the ratio left per token, as if the member
were token-level. Everything else is the eager fused loss: the logits GEMM, the float32 log-softmax,
the clipped surrogate, the mask and grpo's normaliser."""
import torch
import torch.nn.functional as F


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    old_logprobs, completion_mask, loss_type="grpo", importance_sampling_level="sequence"):
    logits = F.linear(hidden, weight)
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, completion_ids.long().unsqueeze(-1))
    logp = logp.squeeze(-1)
    keep = completion_mask != 0
    ratio = torch.exp(logp - old_logprobs.float())  # per token: the sequence's mean is never taken
    adv = advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = torch.where(keep, -torch.where(unclipped <= clipped, unclipped, clipped), torch.zeros_like(ratio))
    return (per_token.sum(-1) / keep.float().sum(-1).clamp(min=1.0)).mean()
