"""What a worker may leave behind, and how the session makes sure it leaves nothing (issue 28).

The launcher (launch.py), run as root, puts the worker in
- its own IPC namespace (CPU): SysV shared memory, semaphores and message queues and POSIX message
  queues exist only there and are gone with its last process. Not on CUDA, unmeasured there (the
  legacy CUDA IPC handles already refuse a PID namespace; docs/checks.md);
- its own mount namespace with a private, empty tmpfs over every world-writable place
  (privilege.writable_places: /tmp, /var/tmp, /run/lock, on the CPU /dev/shm, which holds POSIX
  shared memory); its HOME, TMPDIR and caches are in the session's scratch tree, removed at the end.
The launcher writes back what it set up and what the kernel refused (with the capability missing);
`describe` turns that into the worker's `isolation` block of the report. After the worker's last
process ended, `clean_up` sweeps (leftovers.py) every place and IPC namespace the worker reached
that was not its own, when its uid was its own (drawn, uids.py); the block records what it removed.

Decision (docs/checks.md, "Worker namespaces"): unshare(2) through ctypes in the launcher, the
validator's own code between fork and exec, which already made the mount namespace. Not the
util-linux `unshare` binary (one more exec, and not everywhere) nor bwrap (optional, and it would
make the sandbox mandatory); Python 3.11 has no os.unshare.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

from grpo_conform.isolation import leftovers, privilege

REPORT_TIMEOUT = 30.0


def wanted(device: str, sandboxed: bool) -> dict[str, bool]:
    """Which namespaces the launcher is asked for: only root can make them without a user namespace.
    `proc`: a procfs with hidepid=2 (kernel 5.8+, where each proc mount has its own options; not
    under bwrap, whose /proc is its own already)."""
    root = os.getuid() == 0
    return {"ipc": root and device != "cuda", "mounts": root, "proc": root and not sandboxed and _kernel_at_least(5, 8)}


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def read_report(fd: int, timeout: float = REPORT_TIMEOUT) -> dict[str, Any]:
    """The launcher's JSON line, or {} when it died first. Read up to the newline, not to EOF: under
    bwrap the sandbox's own process keeps an inherited copy of the pipe open."""
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and b"\n" not in data:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    try:
        facts = json.loads(data.split(b"\n", 1)[0].decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return facts if isinstance(facts, dict) else {}


def describe(facts: dict[str, Any], identity: privilege.WorkerIdentity, device: str,
             sandbox: str) -> dict[str, Any]:
    """The `isolation` block: namespaces, private places, and what is left to the fallback sweep."""
    private = list(facts.get("private") or [])
    if sandbox == "bwrap":  # bwrap's own tmpfs /tmp and /dev, the rest read-only
        exposed = [] if device != "cuda" else [p for p in ("/dev/shm",) if os.path.isdir(p)]
        ipc = True if device != "cuda" else facts.get("ipc_namespace", False)
    else:
        exposed = [p for p in privilege.writable_places("cpu") if p not in private]
        ipc = facts.get("ipc_namespace", False)
    block: dict[str, Any] = {
        "ipc_namespace": ipc,
        "mount_namespace": facts.get("mount_namespace", False),
        "private": private,
        "not_private": exposed,
    }
    if facts.get("proc"):
        block["proc"] = facts["proc"]
    if facts.get("refused"):
        block["refused"] = facts["refused"]
    if not exposed and ipc is True:
        block["fallback"] = "not needed: every writable place and the IPC namespace are the worker's own"
    elif identity.drawn:
        what = ", ".join(exposed + ([] if ipc is True else ["SysV IPC"]))
        block["fallback"] = f"after the worker ended, what its uid {identity.uid} left in {what} is removed"
    else:
        block["fallback"] = ("none: the worker's uid is not its own (the validator's, or GRPO_CONFORM_WORKER_USER), "
                             "so what it leaves outside its namespaces cannot be told from others' files")
    return block


def clean_up(block: dict[str, Any], identity: privilege.WorkerIdentity, started: float) -> None:
    """The fallback sweep (after the worker's last process ended), recorded in the block."""
    if not identity.drawn or not block or "removed" in block:  # "removed": swept already (closed twice)
        return
    places, sysv = block.get("not_private", []), block.get("ipc_namespace") is not True
    if not places and not sysv:
        return
    removed = leftovers.sweep(identity.uid, places, sysv, since=started - 1.0)
    block["removed"] = {k: v for k, v in removed.items() if v}
