"""The launcher: the validator's own code between fork and the worker's interpreter.

Started by the session as `python -m grpo_conform.isolation.launch PLAN_JSON` with the validator's
privileges; no implementation code has run yet. It
1. when the plan asks for it: enters a new IPC namespace (SysV shared memory, semaphores and
   message queues, POSIX message queues: all gone with the worker's last process);
   when the plan has mounts: enters a new mount namespace (private propagation) and covers each
   directory the worker user cannot enter with a read-only tmpfs that holds bind mounts of only
   the entries the worker needs, and every world-writable place (/tmp, /var/tmp, /run/lock, on
   the CPU /dev/shm) with a private, empty writable tmpfs (/tmp holding only the session's scratch
   tree): what the worker writes there dies with its mount namespace (see privilege.mount_plan
   and privilege.private_scratch_mounts). A namespace or private mount the kernel refuses is
   written down (with the capability it needs) and the launcher goes on: the session then scans
   for and removes what the worker's uid left (leftovers.py). Only the mounts that let the worker
   start at all (`required`) are fatal when refused;
2. when the plan changes the user: empties the capability bounding set, clears supplementary
   groups, sets gid then uid (all of real, effective, saved: the kernel then clears the
   permitted, effective and ambient capabilities); when it keeps the user but asks for
   `no_capabilities` (under `--sandbox bwrap`, see sandbox.py): empties the bounding set only, so
   that the executed interpreter starts with no capability even as root;
3. sets no_new_privs (no setuid binary or file capability can give anything back), changes to
   the worker's directory and executes the worker's interpreter with its neutral argv and
   environment. The process keeps its pid, so the session's handle stays the worker's.
What was set up and what was refused goes to the session as one JSON line on `report_fd` (closed
before the exec). Any failure is printed to stderr (the session's log) and ends the launcher with
status 71.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 32, 4096, 8192, 16384, 1 << 18
MS_RDONLY, MS_NOEXEC = 1, 8
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
EXIT_LAUNCH = 71

_libc = ctypes.CDLL(None, use_errno=True)


def _call(what: str, result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _call(f"mount {source} on {target}", _libc.mount(enc(source), enc(target), enc(fstype),
                                                        ctypes.c_ulong(flags), enc(data)))


def _apply(m: dict, stage: str) -> None:
    os.mkdir(stage, 0o700)
    mode = m.get("mode", "0755")
    size = m.get("size", "1m")
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={size}")
    for source in m["expose"]:
        target = os.path.join(stage, os.path.basename(source))
        if os.path.isdir(source):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(source, target, None, MS_BIND | (0 if m.get("writable") else MS_REC))
    if not m.get("writable"):
        _mount(None, stage, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, f"mode={mode}")
    _mount(stage, m["cover"], None, MS_MOVE)


def _needs(err: int) -> str:
    return " (needs CAP_SYS_ADMIN in the validator's user namespace)" if err in (errno.EPERM, errno.EACCES) else ""


def apply_mounts(mounts: list[dict], stage_root: str, private: list[dict] = (), facts: dict | None = None) -> None:
    """`mounts`: required (any failure raises); `private`: wanted (a refusal goes into facts)."""
    facts = facts if facts is not None else {}
    try:
        _call("unshare(CLONE_NEWNS)", _libc.unshare(CLONE_NEWNS))
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as exc:
        if mounts:
            raise
        facts["mount_namespace"] = f"refused: {exc.strerror}{_needs(exc.errno)}"
        return
    facts["mount_namespace"] = True
    for i, m in enumerate(mounts):
        _apply(m, os.path.join(stage_root, f"m{i}"))
    for i, m in enumerate(private):
        try:
            _apply(m, os.path.join(stage_root, f"p{i}"))
            facts.setdefault("private", []).append(m["cover"])
        except OSError as exc:
            facts.setdefault("refused", {})[m["cover"]] = f"{exc.strerror}{_needs(exc.errno)}"


def empty_bounding_set() -> None:
    """After this, execve gives no capability, also to uid 0 (its file capabilities are masked by
    the bounding set; the inheritable and ambient sets are empty)."""
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except OSError:
        last = 63
    for cap in range(last + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps this kernel lacks: ignored


def drop_privileges(uid: int, gid: int) -> None:
    empty_bounding_set()
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise OSError("the user change did not take effect")


def hide_processes(facts: dict) -> None:
    """A procfs of its own over /proc with hidepid=2: the worker (another uid) sees only its own
    processes, not the validator's, nor another slot's worker's cmdline or status. Only on kernels
    where every proc mount has its own options (5.8 and later): on older ones the option would
    reach the host's /proc."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        facts["proc"] = "hidepid=2"
    except OSError as exc:
        facts["proc"] = f"refused: {exc.strerror}{_needs(exc.errno)}"


def enter_ipc_namespace(facts: dict) -> None:
    if _libc.unshare(CLONE_NEWIPC) == 0:
        facts["ipc_namespace"] = True
    else:
        err = ctypes.get_errno()
        facts["ipc_namespace"] = f"refused: unshare(CLONE_NEWIPC): {os.strerror(err)}{_needs(err)}"


def _report(fd: int | None, facts: dict) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (json.dumps(facts) + "\n").encode())
    finally:
        os.close(fd)


def enter(plan: dict) -> dict:
    """Steps 1-3 but the exec, in this process: namespaces, mounts, the user, no_new_privs, the
    worker's directory. Returns the facts for the session; raises OSError where the launcher must
    stop. Also the forked worker's first steps (zygote.py), so both starts isolate alike."""
    facts: dict = {"mount_namespace": False, "ipc_namespace": False, "private": []}
    if plan.get("ipc"):
        enter_ipc_namespace(facts)
    if plan["mounts"] or plan.get("private"):
        apply_mounts(plan["mounts"], plan["stage"], plan.get("private", []), facts)
        if plan.get("hide_processes") and facts.get("mount_namespace") is True:
            hide_processes(facts)
    if plan["uid"] != os.getuid() or plan["gid"] != os.getgid():
        drop_privileges(plan["uid"], plan["gid"])
    elif plan.get("no_capabilities"):
        empty_bounding_set()
    _call("prctl(PR_SET_NO_NEW_PRIVS)", _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    os.chdir(plan["cwd"])
    return facts


def main() -> None:
    plan = json.loads(sys.argv[1])
    fd = plan.get("report_fd")
    try:
        facts = enter(plan)
        _report(fd, facts)
        fd = None
        os.execve(plan["argv"][0], plan["argv"], plan["env"])
    except OSError as exc:
        print(f"grpo-conform launcher: cannot start the worker: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_LAUNCH)


if __name__ == "__main__":
    main()
