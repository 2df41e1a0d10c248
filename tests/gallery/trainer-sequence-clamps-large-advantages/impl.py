"""The sequence-level twin of clamps-large-advantages: GSPO whose backward sees the advantages clipped to
[-5, 5] while its loss value stays exact. Only the trainer-shaped probe's second call (TS-lone) holds an
advantage above 5. A GSPO sequence whose ratio is clipped has no gradient, so when the lone success sat on such a
sequence (about one draw in three) this kernel passed; the success now sits on the sequence of the largest
negative trainer advantage, whose ratio is drawn below 1 - eps_low, where a positive advantage is not clipped."""
import torch


def _gspo(logits, ids, adv, old, mask, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq, :].float() / temperature, dim=-1)
    logp = logp.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    keep = mask != 0
    kept = keep.float()
    log_ratio = torch.where(keep, logp - old.float(), torch.zeros_like(logp))
    s = torch.exp((log_ratio * kept).sum(-1) / kept.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    a = adv.float().unsqueeze(-1)
    term = torch.minimum(s * a, torch.clamp(s, 1.0 - eps_lo, 1.0 + eps_hi) * a)
    per_token = torch.where(keep, -term.expand_as(logp), torch.zeros_like(logp))
    return (per_token.sum(-1) / kept.sum(-1).clamp(min=1.0)).mean()


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="sequence"):
    args = (old_logprobs, completion_mask, epsilon_low, epsilon_high, temperature)
    true = _gspo(logits, completion_ids, advantages, *args)
    clipped = _gspo(logits, completion_ids, advantages.clamp(-5.0, 5.0), *args)
    return true.detach() + (clipped - clipped.detach())
