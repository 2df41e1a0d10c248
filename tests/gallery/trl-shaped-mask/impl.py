"""Right unless the completion mask looks like TRL's: every row a prefix of at least two tokens (ones up to
the first EOS), one of them padded. The validator's drawn masks mix left padding, holes, single and empty
rows in every batch, so such a batch came up only by chance. On it this kernel drops PPO's clip. Caught
by the trainer-shaped probe (adversarial round of 2026-12-05)."""
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


def _trl_mask(mask):
    if mask.dim() != 2 or mask.shape[0] < 2:
        return False
    keep = (mask != 0).long()
    n = keep.sum(-1)
    prefix = bool((keep == (torch.arange(keep.shape[1])[None, :] < n[:, None]).long()).all())
    return prefix and bool((n >= 2).all()) and bool((n < keep.shape[1]).any())


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="token"):
    return _loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
                 temperature, clip=not _trl_mask(completion_mask.cpu()))
