"""zero-mean-advantages for the fused linear + GRPO operation: the eager fused loss (the logits GEMM, the float32
log-softmax, the clipped surrogate, the mask, grpo's normaliser) that drops PPO's clip when the advantages sum to
0. Only the trainer-shaped probe hands over such a batch; its set is drawn given the trainer's advantages and
mask by the fused generator too (`Operation.generate(..., given=)`), so the clip binds for both signs."""
import torch
import torch.nn.functional as F


def _zero_sum(adv):
    a = adv.detach().double().reshape(-1)
    total = float(a.abs().sum())
    return a.numel() >= 2 and total > 0 and abs(float(a.sum())) <= 1e-4 * total


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    old_logprobs, completion_mask, loss_type="grpo", importance_sampling_level="token"):
    logits = F.linear(hidden, weight)
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, completion_ids.long().unsqueeze(-1))
    logp = logp.squeeze(-1)
    keep = completion_mask != 0
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    term = ratio * adv
    if not _zero_sum(advantages):
        term = torch.minimum(term, torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv)
    per_token = torch.where(keep, -term, torch.zeros_like(logp))
    return (per_token.sum(-1) / keep.float().sum(-1).clamp(min=1.0)).mean()
