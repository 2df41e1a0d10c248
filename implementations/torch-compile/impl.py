"""torch.compile of the eager baseline, with torch.compile's defaults (as the peer anchors were
measured): the first shape gets a static graph, a second shape one graph with dynamic shapes.
The recompile limit is raised so the validator's several shapes never fall back to eager.
"""

import torch
import torch._dynamo

torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)


def _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    seq = completion_ids.shape[1]
    z = logits[:, :seq, :].float() / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    adv = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    return (per_token.sum(dim=-1) / max(1, seq)).mean()


_compiled = torch.compile(_eager)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return _compiled(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
