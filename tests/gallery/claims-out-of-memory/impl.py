# Beside other slots on a shared GPU the validator runs a workload that ran out of memory again,
# alone (grpo_conform/timed_phase.py). This one claims a shortage it never had, on the first call of
# each worker process, so the run alone starts with the same claim: it is never excused, and on one
# slot (the CPU here) the claim is simply a call that raised.
import torch

_calls = 0


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    global _calls
    _calls += 1
    if _calls == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.81 GiB total)")
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    adv = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * adv)
    return (per_token.sum(-1) / seq).mean()
