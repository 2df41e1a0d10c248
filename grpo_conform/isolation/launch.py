"""The launcher: the validator's own code between fork and the worker's interpreter.

Started by the session as `python -m grpo_conform.isolation.launch PLAN_JSON` with the validator's
privileges; no implementation code has run yet. It
1. when the plan has mounts: enters a new mount namespace (private propagation) and covers each
   directory the worker user cannot enter with a read-only tmpfs that holds bind mounts of only
   the entries the worker needs, and /tmp (and on the CPU /dev/shm) with a private writable tmpfs
   holding only the session's scratch tree: what the worker writes there dies with its mount
   namespace, so it cannot leave files behind (see privilege.mount_plan);
2. when the plan changes the user: empties the capability bounding set, clears supplementary
   groups, sets gid then uid (all of real, effective, saved: the kernel then clears the
   permitted, effective and ambient capabilities); when it keeps the user but asks for
   `no_capabilities` (under `--sandbox bwrap`, see sandbox.py): empties the bounding set only, so
   that the executed interpreter starts with no capability even as root;
3. sets no_new_privs (no setuid binary or file capability can give anything back), changes to
   the worker's directory and executes the worker's interpreter with its neutral argv and
   environment. The process keeps its pid, so the session's handle stays the worker's.
Any failure is printed to stderr (the session's log) and ends the launcher with status 71.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 32, 4096, 8192, 16384, 1 << 18
MS_RDONLY = 1
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


def apply_mounts(mounts: list[dict], stage_root: str) -> None:
    _call("unshare(CLONE_NEWNS)", _libc.unshare(CLONE_NEWNS))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for i, m in enumerate(mounts):
        stage = os.path.join(stage_root, f"m{i}")
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


def main() -> None:
    plan = json.loads(sys.argv[1])
    try:
        if plan["mounts"]:
            apply_mounts(plan["mounts"], plan["stage"])
        if plan["uid"] != os.getuid() or plan["gid"] != os.getgid():
            drop_privileges(plan["uid"], plan["gid"])
        elif plan.get("no_capabilities"):
            empty_bounding_set()
        _call("prctl(PR_SET_NO_NEW_PRIVS)", _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        os.chdir(plan["cwd"])
        os.execve(plan["argv"][0], plan["argv"], plan["env"])
    except OSError as exc:
        print(f"grpo-conform launcher: cannot start the worker: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_LAUNCH)


if __name__ == "__main__":
    main()
