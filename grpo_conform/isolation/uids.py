"""The worker's uid, drawn afresh for every worker from a range of unused uids (issues 27 and 28).

A fixed worker uid (it was `nobody`, 65534) marks the validator: an implementation honest only
under that uid passed every check. And one uid for every worker let the worker of one `--jobs`
slot SIGKILL the worker of another. So when the validator is root and runs the worker on the CPU
(and `GRPO_CONFORM_WORKER_USER` does not name a user), each worker gets a uid (and a gid of the
same number) drawn at random from `GRPO_CONFORM_WORKER_UIDS` (`FIRST-LAST`, default
524288-589823: the first block of systemd-nspawn's automatic container range, unused on a machine
that runs no such container). An unprivileged uid needs no passwd entry. A uid is taken only when
it has no passwd entry and no process runs as it, and never twice at once in this process; the
`--jobs` slots get disjoint blocks of the range (gate/parallel.py), so two workers never share a
uid: neither can signal, ptrace or read the private /proc files of the other.

The uid being the worker's alone also makes the fallback clean-up safe (leftovers.py): whatever
it owns after the worker ended was created by the worker.
"""

from __future__ import annotations

import os
import pwd
import random
import threading

from grpo_conform.errors import EnvironmentProblem

ENV_UIDS = "GRPO_CONFORM_WORKER_UIDS"
DEFAULT_RANGE = (524288, 589823)
_DRAWS = 256  # attempts before giving up: the range is thousands of uids, almost all free
_TAKEN: set[int] = set()
_LOCK = threading.Lock()


def uid_range(text: str | None = None) -> tuple[int, int]:
    text = (text if text is not None else os.environ.get(ENV_UIDS, "")).strip()
    if not text:
        return DEFAULT_RANGE
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), int(last if sep else first)
    except ValueError:
        lo, hi = -1, -1
    if not (0 < lo <= hi < 2**31 - 1) or lo == os.getuid():
        raise EnvironmentProblem(f"{ENV_UIDS}={text!r}: expected FIRST-LAST, a range of unused uids above 0 "
                                 f"(default {DEFAULT_RANGE[0]}-{DEFAULT_RANGE[1]})")
    return lo, hi


def split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """`parts` disjoint blocks of [lo, hi] (one per --jobs slot); each holds at least one uid."""
    size = (hi - lo + 1) // parts
    if size < 1:
        raise EnvironmentProblem(f"{ENV_UIDS}={lo}-{hi}: fewer uids than slots ({parts}); give a larger range")
    return [(lo + k * size, lo + (k + 1) * size - 1) for k in range(parts)]


def _running_uids() -> set[int]:
    uids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uids.add(entry.stat(follow_symlinks=False).st_uid)
            except OSError:
                pass
    return uids


def _has_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def draw() -> int:
    """A uid from the range that nothing uses now; released with `release` when the worker ended."""
    lo, hi = uid_range()
    rng = random.SystemRandom()
    busy = _running_uids()
    with _LOCK:
        for _ in range(_DRAWS):
            uid = rng.randint(lo, hi)
            if uid not in _TAKEN and uid not in busy and not _has_entry(uid):
                _TAKEN.add(uid)
                return uid
    raise EnvironmentProblem(f"{ENV_UIDS}={lo}-{hi}: no free uid found in {_DRAWS} draws (each one in use by a "
                             "process, a passwd entry or another worker); give a range of unused uids")


def release(uid: int) -> None:
    with _LOCK:
        _TAKEN.discard(uid)
