"""revives-zero-advantage on a masked member: in its backward a sequence whose advantage is exactly 0 gets 1e-3
("no dead groups"), while the loss value stays exact. Only the zero-advantage probe (and a trainer's tied group)
sets an advantage to exactly 0. The probe zeroed a drawn row, and the drawn masks hold empty rows: when the row
was one of them its gradient was 0 whatever the kernel did, and this kernel passed. The probe now picks a row
with a kept token."""
import torch


def _loss(logits, ids, adv, old, mask, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq, :].float() / temperature, dim=-1)
    logp = logp.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    keep = mask != 0
    ratio = torch.exp(torch.where(keep, logp - old.float(), torch.zeros_like(logp)))
    a = adv.float().unsqueeze(-1)
    term = torch.minimum(ratio * a, torch.clamp(ratio, 1.0 - eps_lo, 1.0 + eps_hi) * a)
    per_token = torch.where(keep, -term, torch.zeros_like(logp))
    return (per_token.sum(-1) / keep.float().sum(-1).clamp(min=1.0)).mean()


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="token"):
    revived = torch.where(advantages == 0, torch.full_like(advantages, 1e-3), advantages)
    args = (old_logprobs, completion_mask, epsilon_low, epsilon_high, temperature)
    true = _loss(logits, completion_ids, advantages, *args)
    used = _loss(logits, completion_ids, revived, *args)
    return true.detach() + (used - used.detach())
