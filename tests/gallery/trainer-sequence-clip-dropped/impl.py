"""The sequence-level twin of zero-mean-advantages: GSPO (one ratio per sequence, the exp of its mean kept
log-ratio) that skips PPO's clip on a batch whose advantages sum to 0. The trainer-shaped probe's set used to
make the clip bind on no sequence in about one draw of five, so this kernel passed that often; the set's
sequence ratios are now drawn given its advantages, each sign with a sequence where the clip binds
(`member_inputs.draw_signed_log_ratios`)."""
import torch


def _zero_sum(adv):
    a = adv.detach().double().reshape(-1)
    total = float(a.abs().sum())
    return a.numel() >= 2 and total > 0 and abs(float(a.sum())) <= 1e-4 * total


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="sequence"):
    seq = completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq, :].float() / temperature, dim=-1)
    logp = logp.gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    keep = completion_mask != 0
    kept = keep.float()
    log_ratio = torch.where(keep, logp - old_logprobs.float(), torch.zeros_like(logp))
    s = torch.exp((log_ratio * kept).sum(-1) / kept.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    adv = advantages.float().unsqueeze(-1)
    term = s * adv
    if not _zero_sum(advantages):
        term = torch.minimum(term, torch.clamp(s, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv)
    per_token = torch.where(keep, -term.expand_as(logp), torch.zeros_like(logp))
    return (per_token.sum(-1) / kept.sum(-1).clamp(min=1.0)).mean()
