"""Ending a worker with every process it started.

The validator is a child subreaper (privilege.harden_parent): a worker descendant that calls
setsid or double-forks comes back to it when its parent dies. `end_tree` SIGKILLs a worker's
descendants, the worker, and every child that came back, in rounds until none is left. `LIVE`
holds every live session (so a worker is never taken for an orphan, and `session.end_all` can end
them all on SIGINT/SIGTERM).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

LIVE: dict[int, Any] = {}  # id(session) -> WorkerSession
LOCK = threading.RLock()


def proc_stats():
    """(pid, the fields of /proc/pid/stat after the command name) of every process this one can see;
    field 1 is the parent, 3 the session, 19 the start time in clock ticks."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 19:
            yield int(entry.name), fields


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, session id, uid) of every process this one can see."""
    table = {}
    for pid, fields in proc_stats():
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        table[pid] = (int(fields[1]), int(fields[3]), uid)
    return table


def _descendants(table: dict[int, tuple[int, int, int]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _orphans(table: dict[int, tuple[int, int, int]]) -> set[int]:
    """Children of this process that no live session started and that are not its own helpers: a
    worker's descendants that lost their parent and came back to the subreaper. Our own helpers
    (compilers, git) share our session id and uid; an escaped worker descendant has another
    session id (the worker's, or its own after setsid) or the worker user's uid."""
    me, (_, my_sid, _) = os.getpid(), table.get(os.getpid(), (0, os.getsid(0), os.getuid()))
    with LOCK:
        spared = {s.proc.pid for s in LIVE.values() if s.proc is not None} | _HELPERS
    return {pid for pid, (ppid, sid, uid) in table.items()
            if ppid == me and pid not in spared and (sid != my_sid or uid != os.getuid())
            and not (uid == os.getuid() and _is_slot(pid))}


def _is_slot(pid: int) -> bool:
    """The CLI's own --jobs slot processes (own session, our uid). A worker running as another
    user cannot pass for one; a same-user worker could, which is one of the things a validator that
    is not root does not get (docs/checks.md)."""
    try:
        return b"grpo_conform.gate.slot" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


_HELPERS: set[int] = set()


def register_helper(pid: int) -> None:
    """A child of the validator in its own session that is not a worker descendant and must not be
    ended as an orphan (register it before a session closes; `unregister_helper` when it ended)."""
    with LOCK:
        _HELPERS.add(pid)


def unregister_helper(pid: int) -> None:
    with LOCK:
        _HELPERS.discard(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


QUIET_ROUNDS = 5  # after a kill, this many empty scans in a row (~0.1 s) before the tree counts as ended


def end_tree(root: int | None, rounds: int = 300) -> None:
    """SIGKILL `root`'s descendants, `root` and every orphan that came back, until none is left
    (a process that forks meanwhile is caught in the next round: its child's parent is dead, so the
    child comes back to this subreaper). Once something was killed, the tree counts as ended only
    after QUIET_ROUNDS empty scans: a descendant can come back to this subreaper after a first empty
    scan (its dying parent still exiting, or a sandbox's monitor passing it on), and one empty scan
    let a setsid'd `sleep` of tests/test_sandbox.py outlive its timeout now and then."""
    killed, quiet = False, 0
    for _ in range(rounds):
        table = _proc_table()
        victims = _orphans(table)
        if root is not None and root in table:
            victims |= _descendants(table, root)
            if table[root][0] == os.getpid():
                victims.add(root)
        victims = {p for p in victims if _alive(p)}
        if not victims:
            quiet += 1
            if not killed or quiet >= QUIET_ROUNDS:
                return
            time.sleep(0.02)
            continue
        killed, quiet = True, 0
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
        for pid in victims:
            if table.get(pid, (0,))[0] == os.getpid() and pid != root:
                _reap(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in (b"Z", b"X"):
        _reap(pid)
        return False
    return True
