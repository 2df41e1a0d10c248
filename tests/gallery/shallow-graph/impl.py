"""Right only when the logits are at most one autograd node from a leaf: a leaf, a view of one, or `leaf * 1.0`,
which is all the validator ever passed until the adversarial round of 2026-12-05. A model's logits are many
nodes deep; there this kernel drops PPO's clip. The non-leaf probe now passes the logits through a chain of
value-preserving steps of drawn length (2 to 32), which this check never takes for shallow."""
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


def _near_a_leaf(t):
    """A leaf, or one node away from an AccumulateGrad (a graph walk: no frames, no validator names)."""
    if not t.requires_grad or t.grad_fn is None:
        return True
    return any(child is not None and type(child).__name__ == "AccumulateGrad" for child, _ in t.grad_fn.next_functions)


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low=0.2, epsilon_high=0.2,
              temperature=1.0, loss_type="grpo", importance_sampling_level="token"):
    return _loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
                 temperature, clip=_near_a_leaf(logits))
