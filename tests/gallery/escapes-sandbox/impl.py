import os
import socket
import time

import torch

# Outside the worker's scratch directory and its private /tmp, writable by any user (1777).
OUTSIDE = "/var/tmp"
# An abstract unix socket: it exists only in the network namespace of whoever listens on it.
SOCKET = "\0grpo-conform-sandbox-probe"


def _escape() -> None:
    """Plant a file outside the scratch directory and phone home; raise if either is refused."""
    refused = []
    path = os.path.join(OUTSIDE, f"grpo-conform-escaped-{os.getpid()}-{time.monotonic_ns()}")
    try:
        with open(path, "w") as f:
            f.write("written by a worker\n")
    except OSError as exc:
        refused.append(f"write {path}: {exc}")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(SOCKET)
        s.sendall(b"escaped")
    except OSError as exc:
        refused.append(f"connect @{SOCKET[1:]}: {exc}")
    finally:
        s.close()
    if refused:
        raise PermissionError("escape refused: " + "; ".join(refused))


def _eager(logits, ids, adv, eps_lo, eps_hi, temperature):
    seq = ids.shape[1]
    z = logits[:, :seq].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    return (per_token.sum(-1) / seq).mean()


_escaped = False


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    global _escaped
    if not _escaped:  # once per worker process
        _escape()
        _escaped = True
    return _eager(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)
