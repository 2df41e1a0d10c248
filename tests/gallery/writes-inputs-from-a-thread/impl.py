"""Right arithmetic, and a helper thread that never stops: it keeps writing one element of the last
advantages tensor it was handed, a shared buffer the validator also reads. The validator draws every
input set into its own copies, which no implementation maps, and copies them out; the copies are what the
reference reads, so the thread can change neither the draws nor the reference, and the buffers it wrote
differ from those copies after the next call (no-mutation)."""
import threading
import time

import torch

_last = {}


def _keep_writing():
    while True:
        adv = _last.get("advantages")
        if adv is not None:
            adv[0] = 123.0
        time.sleep(0.0005)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    if not _last:
        threading.Thread(target=_keep_writing, daemon=True).start()
    _last["advantages"] = advantages
    seq = completion_ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.detach().clone().float().unsqueeze(-1)  # its own copy: the thread may write the buffer
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean()
