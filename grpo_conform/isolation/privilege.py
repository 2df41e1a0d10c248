"""Who the worker runs as, and what the parent checks about it from the outside.

When the validator runs as root (CI and containers usually do), the worker drops to an
unprivileged user: on the CPU by default a uid (and gid) of its own, drawn afresh for every worker
(uids.py: no fixed identity marks the validator, no two workers share one);
`GRPO_CONFORM_WORKER_USER` (a name or a numeric uid, optionally `uid:gid`; `nobody` is uid and gid
65534 when the system has no such entry) fixes one instead; on CUDA the default is root (below). The drop happens in the
launcher (grpo_conform/isolation/launch.py) before the worker's interpreter starts: supplementary
groups cleared, gid then uid set, the capability bounding set emptied, `no_new_privs` set; the
uid change clears the permitted, effective and ambient capabilities. `GRPO_CONFORM_WORKER_USER=root`
keeps the old behaviour (same user), and is reported as such.

A Python installed under a directory the worker user cannot enter (pyenv under /root, mode 0700)
would make the worker unable to start; the launcher then gives the worker a mount namespace in
which that directory is a fresh read-only-by-others tmpfs holding only the subtrees the worker
needs (the interpreter, its library paths, the validator's package), so nothing else of it (keys,
shell history) becomes visible. `mount_plan` computes it from the parent's own sys.path.

The parent makes itself non-dumpable (PR_SET_DUMPABLE 0): then neither a same-uid process nor
root without CAP_SYS_PTRACE can ptrace it or open /proc/<pid>/mem, which also protects a
validator that is not root. `observed_privileges` reads /proc/<worker>/status from the parent,
so the evidence does not rest on the worker's word.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpo_conform
from grpo_conform.errors import EnvironmentProblem
from grpo_conform.isolation import uids

ENV_USER = "GRPO_CONFORM_WORKER_USER"
DEFAULT_USER = "nobody"
NOBODY = 65534
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class WorkerIdentity:
    uid: int
    gid: int
    name: str
    drawn: bool = False  # a uid of its own, drawn for this worker (uids.py): nothing else runs as it

    @property
    def drops(self) -> bool:
        """True when the worker runs as another user than the validator."""
        return self.uid != os.getuid()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": self.uid, "gid": self.gid, "user": self.name}
        if self.drawn:
            lo, hi = uids.uid_range()
            out["drawn_from"] = f"{lo}-{hi}"
        return out


def _prctl(option: int, value: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0)


def harden_parent() -> None:
    """Non-dumpable (no ptrace, no /proc/<pid>/mem for anyone without CAP_SYS_PTRACE), and a child
    subreaper (descendants of a worker that escape their parent come back to the validator, which
    ends them: see session.end_descendants). Idempotent."""
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


#: Measured on the H200 machines (device tool, 2026-12-01): a worker of another uid cannot open the
#: parent's CUDA IPC handles ("mapping of buffer object failed"), so on CUDA the default worker
#: user is the validator's own; GRPO_CONFORM_WORKER_USER still chooses one explicitly.
CUDA_DEFAULT_USER = "root"


def worker_identity(setting: str | None = None, device: str = "cpu") -> WorkerIdentity:
    """The user the worker runs as: only root can choose; everyone else runs it as themselves."""
    if os.getuid() != 0:
        me = os.getuid()
        try:
            name = pwd.getpwuid(me).pw_name
        except KeyError:
            name = str(me)
        return WorkerIdentity(me, os.getgid(), name)
    setting = (setting if setting is not None else os.environ.get(ENV_USER, "")).strip()
    if not setting and device != "cuda":
        uid = uids.draw()  # no fixed identity marks the validator, no two workers share one (uids.py)
        return WorkerIdentity(uid, uid, str(uid), drawn=True)
    setting = setting or CUDA_DEFAULT_USER
    user, _, group = setting.partition(":")
    try:
        if user.isdigit():
            uid = int(user)
            try:
                entry = pwd.getpwuid(uid)
                gid, name = entry.pw_gid, entry.pw_name
            except KeyError:
                gid, name = uid, user
        else:
            try:
                entry = pwd.getpwnam(user)
                uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
            except KeyError:
                if user != DEFAULT_USER:
                    raise
                uid, gid, name = NOBODY, NOBODY, DEFAULT_USER
        if group:
            gid = int(group) if group.isdigit() else __import__("grp").getgrnam(group).gr_gid
    except (KeyError, ValueError):
        raise EnvironmentProblem(f"{ENV_USER}={setting!r}: no such user or group; expected a user name, a uid, "
                                 "or uid:gid (default: a uid drawn per worker, see GRPO_CONFORM_WORKER_UIDS)") from None
    return WorkerIdentity(uid, gid, name)


def _may(st: os.stat_result, who: WorkerIdentity, bits: tuple[int, int, int]) -> bool:
    if st.st_uid == who.uid:
        return bool(st.st_mode & bits[0])
    if st.st_gid == who.gid:
        return bool(st.st_mode & bits[1])
    return bool(st.st_mode & bits[2])


def blocked_ancestor(path: Path, who: WorkerIdentity) -> Path | None:
    """The outermost directory on the way to `path` that `who` may not enter (owner, group and
    other bits; ACLs are not looked at), or None."""
    path = Path(os.path.abspath(path))
    for d in reversed(path.parents):
        try:
            st = d.stat()
        except OSError:
            return None
        if not _may(st, who, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
            return d
    return None


def needed_paths() -> list[Path]:
    """What the worker's interpreter must reach: itself, its prefixes, every sys.path directory."""
    paths = [Path(sys.executable), Path(os.path.realpath(sys.executable)),
             Path(grpo_conform.__file__).resolve().parent.parent]
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path):
        if p and os.path.exists(p):
            paths.append(Path(p))
            paths.append(Path(os.path.realpath(p)))
    return paths


def mount_plan(who: WorkerIdentity, extra: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """[{"cover": dir the user cannot enter, "expose": [its first-level entries the worker needs]}]."""
    if not who.drops:
        return []
    plan: dict[Path, set[Path]] = {}
    for p in [*needed_paths(), *extra]:
        a = blocked_ancestor(p, who)
        if a is None or a == Path(os.path.abspath(p)):
            continue
        rel = Path(os.path.abspath(p)).relative_to(a)
        plan.setdefault(a, set()).add(a / rel.parts[0])
    return [{"cover": str(a), "expose": sorted(str(e) for e in exposed)} for a, exposed in sorted(plan.items())]


#: The places any user may write on a usual Linux system (mode 1777); those that exist here and are
#: world-writable get a private, empty tmpfs in the worker's mount namespace. /dev/shm holds POSIX
#: shared memory (shm_open). A world-writable directory elsewhere is not covered (docs/checks.md).
WRITABLE_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/var/crash")


def writable_places(device: str) -> list[str]:
    """The world-writable places of WRITABLE_PLACES here (symlinks resolved, each once). On CUDA
    /dev/shm stays shared: torch keeps its CUDA IPC reference counters there."""
    out: list[str] = []
    for place in WRITABLE_PLACES:
        real = os.path.realpath(place)
        try:
            st = os.stat(real)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and real not in out:
            if not (device == "cuda" and real == "/dev/shm"):
                out.append(real)
    return out


def private_scratch_mounts(scratch: Path, device: str, sandboxed: bool = False) -> list[dict[str, Any]]:
    """A private, empty, writable tmpfs over every world-writable place (`writable_places`); /tmp
    holds only the scratch tree (and what the interpreter needs there): whatever the worker writes
    disappears with its mount namespace. Under bwrap only /tmp and (CPU) /dev/shm: the rest of the
    file system is read-only there, and stays so."""
    mounts = []
    scratch = Path(os.path.abspath(scratch))
    places = writable_places(device)
    if sandboxed:
        places = [p for p in ("/tmp", "/dev/shm") if p in places]
    for place in places:
        # The scratch tree's top entry under the place: TMPDIR may be a folder below /tmp (pytest's,
        # a CI runner's), and a worker whose scratch vanished behind the private /tmp could not start.
        top = _top_under(place, str(scratch))
        expose = [top] if top else []
        expose += [p for p in _needed_under(place) if p != top]
        mounts.append({"cover": place, "expose": expose, "mode": "1777", "size": "50%", "writable": True})
    return mounts


def _top_under(place: str, path: str) -> str | None:
    """`place`'s top-level entry that holds `path`, or None when `path` is not below `place`."""
    root, parts = Path(place).parts, Path(os.path.abspath(path)).parts
    return os.path.join(place, parts[len(root)]) if len(parts) > len(root) and parts[:len(root)] == root else None


def _needed_under(place: str = "/tmp") -> list[str]:
    """The top-level entries of `place` holding what the worker must run: the interpreter, its
    prefixes, the grpo_conform package and every directory on sys.path. A checkout or virtual environment under /tmp (a CI clone
    there) would otherwise vanish behind the private /tmp: every worker failed with "cannot start the
    worker: No such file or directory: '/tmp/.../bin/python3'". Only those entries are exposed, as
    they are."""
    out = []
    # sys.path too: the worker's PYTHONPATH is built from it (session.worker_environment), and wheels
    # installed with `pip --target /tmp/site` (the device runs) vanished with the private /tmp.
    for path in (sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix,
                 os.path.dirname(os.path.abspath(grpo_conform.__file__)),
                 *(p for p in sys.path if p and os.path.isdir(p))):
        top = _top_under(place, path)
        if top and top not in out:
            out.append(top)
    return out


_CAPS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def observed_privileges(pid: int) -> dict[str, Any]:
    """The worker's credentials as the kernel reports them (read by the parent, not the worker)."""
    out: dict[str, Any] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        return {"error": f"cannot read /proc/{pid}/status: {exc.strerror}"}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key in ("Uid", "Gid"):
            out[key.lower()] = [int(v) for v in value.split()]
        elif key == "Groups":
            out["groups"] = [int(v) for v in value.split()]
        elif key in _CAPS:
            out[key] = value
        elif key == "NoNewPrivs":
            out["no_new_privs"] = value == "1"
    out["capabilities"] = "none" if all(int(out.get(k, "1"), 16) == 0 for k in _CAPS) else "some"
    return out
