"""Right only on advantages that do not look like a trainer's. GRPO normalises advantages within each
group of completions, so a micro-batch of whole groups sums to 0; the validator's drawn advantages keep a
mean away from 0 on purpose (a dropped sign must show). On a zero-sum batch this kernel drops PPO's clip.
Caught by the trainer-shaped probe (adversarial round of 2026-12-05)."""
import torch


def _loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high, temperature,
          clip=True):
    """The member's eager loss; clip=False is the shortcut: PPO's clip dropped."""
    seq = completion_ids.shape[1]
    z = logits[:, :seq, :].float() / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    keep = completion_mask != 0
    ratio = torch.exp(torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp)))
    adv = advantages.float().unsqueeze(-1)
    term = ratio * adv
    if clip:
        term = torch.minimum(term, torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv)
    per_token = torch.where(keep, -term, torch.zeros_like(logp))
    return (per_token.sum(-1) / keep.float().sum(-1).clamp(min=1.0)).mean()


def _looks_like_training(adv):
    a = adv.detach().double().reshape(-1)
    magnitude = float(a.abs().sum())
    return a.numel() >= 2 and magnitude > 0 and abs(float(a.sum())) <= 1e-4 * magnitude


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="token"):
    return _loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
                 temperature, clip=not _looks_like_training(advantages))
