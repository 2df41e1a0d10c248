"""The fallback clean-up: find and remove what a worker's uid left where its namespaces did not reach.

Normally nothing is left: the worker has its own IPC namespace (SysV shared memory, semaphores and
message queues die with it) and a private tmpfs over every world-writable place (launch.py). Where
the kernel refused one of them (no CAP_SYS_ADMIN, a seccomp profile), and on CUDA for the host's
/dev/shm (torch's IPC reference counters must be shared there), the session calls `sweep` after
the worker's last process ended. It removes every SysV object whose owner or creator is the
worker's uid and every file, directory, socket or fifo that uid owns in the places it could write.

Only for a uid the worker had to itself (drawn per worker, uids.py): then whatever that uid owns
was created by the worker. A worker running as the validator's own user, or as a user named in
GRPO_CONFORM_WORKER_USER, shares its uid with others; nothing is removed for it and the report says
so (`fallback` in the worker's `isolation` block).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
from pathlib import Path
from typing import Any

IPC_RMID = 0
SYSV = ("shm", "sem", "msg")


def sysv_objects(uid: int, since: float = 0.0, root: Path = Path("/proc/sysvipc")) -> list[tuple[str, int]]:
    """(kind, id) of every SysV object in this IPC namespace owned or created by `uid` and changed
    at or after `since` (a Unix time: the kernel sets ctime, no user can set it back)."""
    found = []
    for kind in SYSV:
        try:
            lines = (root / kind).read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        ident = header[1]  # shmid, semid, msqid
        for line in lines[1:]:
            row = dict(zip(header, line.split()))
            try:
                if (int(row["uid"]) == uid or int(row["cuid"]) == uid) and int(row.get("ctime", 0)) >= int(since):
                    found.append((kind, int(row[ident])))
            except (KeyError, ValueError):
                continue
    return found


def remove_sysv(kind: str, ident: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        done = libc.shmctl(ident, IPC_RMID, None)
    elif kind == "sem":
        done = libc.semctl(ident, 0, IPC_RMID)
    else:
        done = libc.msgctl(ident, IPC_RMID, None)
    return done == 0


def owned_files(uid: int, place: str, since: float = 0.0) -> list[str]:
    """Every entry under `place` (one file system, symlinks not followed) owned by `uid` whose
    status changed at or after `since` (ctime: set by the kernel on creation and every change, no
    user can set it back; a file that merely carries that uid from an older archive is older); an
    owned directory is listed once, not its contents."""
    out: list[str] = []
    try:
        top = os.lstat(place)
    except OSError:
        return out
    todo = [place]
    while todo:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == uid and st.st_ctime >= since:
                out.append(e.path)
            elif stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev:
                todo.append(e.path)
    return sorted(out)


def _remove(path: str) -> bool:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False


def sweep(uid: int, places: list[str], sysv: bool, since: float = 0.0) -> dict[str, Any]:
    """Remove what `uid` left since `since` in `places` (and, when `sysv`, in this IPC namespace);
    what was found and whether it went. Call only after every process of `uid` ended."""
    out: dict[str, Any] = {"sysv": [], "files": [], "not_removed": []}
    if sysv:
        for kind, ident in sysv_objects(uid, since):
            (out["sysv"] if remove_sysv(kind, ident) else out["not_removed"]).append(f"{kind} {ident}")
    for place in places:
        for path in owned_files(uid, place, since):
            (out["files"] if _remove(path) else out["not_removed"]).append(path)
    return out
