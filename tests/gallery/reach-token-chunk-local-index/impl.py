import torch

TOKENS_PER_LAUNCH = 16384  # one launch covers at most this many (batch * seq) tokens


def grpo_loss(logits, completion_ids, advantages, old_logprobs, completion_mask, epsilon_low, epsilon_high,
              temperature, loss_type, importance_sampling_level):
    B, seq = completion_ids.shape
    logp = torch.log_softmax(logits[:, :seq].double() / temperature, -1)
    logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    m = (completion_mask != 0).double()
    ratio = torch.exp((logp - old_logprobs.double()) * m)
    n = B * seq
    adv_tok = torch.empty(n, dtype=torch.float64, device=logits.device)
    adv = advantages.double()
    for start in range(0, n, TOKENS_PER_LAUNCH):
        stop = min(start + TOKENS_PER_LAUNCH, n)
        local = torch.arange(stop - start, device=logits.device)
        # BUG: the sequence of a token from its index within the launch, not its flat index (start + local)
        adv_tok[start:stop] = adv[local // seq]
    a = adv_tok.view(B, seq)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean().float()
