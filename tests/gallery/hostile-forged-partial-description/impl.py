"""Hostile output: rewrites the worker's own replies in flight so that each loss description leaves out
the device (every field of the reply model is optional, so such a reply fitted it), staying in step with
the protocol. The parent's contract check read the missing field and raised: the run ended with exit 3,
"a tool problem", blaming nobody. A tensor's description must now be whole, so the reply is refused where
it enters (`runs`: the worker broke the message protocol)."""
import gc
import json
from multiprocessing.connection import Connection

import torch


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    logp = torch.log_softmax(logits[:, :seq].float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


def _strip(raw):
    msg = json.loads(bytes(raw).decode())
    for desc in [msg.get("loss"), (msg.get("report") or {}).get("loss")]:
        if isinstance(desc, dict):
            desc.pop("device", None)
    return json.dumps(msg).encode()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    gc.unfreeze()  # the worker froze its own objects before importing this module: thaw them to find its pipe
    conn = next(o for o in gc.get_objects() if isinstance(o, Connection))
    if not getattr(conn, "_stripped", False):
        send = conn.send_bytes
        conn.send_bytes = lambda raw, *a: send(_strip(raw), *a)
        conn._stripped = True
    return _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
