"""CPU workers forked from a zygote that imported torch once (the suite's and `check`'s fixed cost).

Every worker used to be a fresh interpreter (launch.py): python's start and `import torch`, ~2 s of
CPU per worker, paid by every gallery folder and every implementation `check` runs. On the CPU, with
no sandbox, a worker now comes from a zygote instead: a process of the validator's own, started the
first time a worker is wanted, exactly as a worker is (the same neutral spawn argv, the allow-listed
environment without the per-session entries, no key material), that imports torch and the worker's
modules and then only forks. Per worker:

1. the session sends the zygote its plan (launch.py's: user, namespaces, mounts, directory), its
   environment and three descriptors (the message socket, the output log, the report pipe) over a
   SOCK_SEQPACKET socket (SCM_RIGHTS);
2. the zygote forks a helper that forks the worker and exits at once: the worker, orphaned, comes back
   to the nearest subreaper, the validator (privilege.harden_parent), and is from then on the
   session's own child, as a Popen child is: its exit status, `end_tree`, `killpg` work unchanged
   (`Forked` stands for the Popen object). The zygote answers with the worker's pid once the helper
   is reaped, i.e. once the worker is the validator's child; the session checks that it is;
3. the worker waits until it has been handed over (its PDEATHSIG, set by the worker, must name the
   validator), reseeds torch's and numpy's generators (as a fresh import would), calls setsid, puts /dev/null, the log and the log on 0, 1, 2, closes every other
   descriptor but the socket and the report pipe, takes the session's environment (and forgets
   tempfile's cached directory), runs launch.enter (the same namespaces, mounts, user change,
   capability and no_new_privs steps as the launcher) and reports, then serves the session as any
   worker (worker.run). A failure there ends it with the launcher's status 71.

What does not change: one process per implementation with its own uid, namespaces and scratch tree;
the worker's argv and parent; what the worker can read of the validator (the zygote holds the
allow-listed environment only: nothing the exec'd worker could not see). What differs: the worker
has torch imported before `load` (and torch.fx.experimental.symbolic_shapes, with sympy, which
torch.autograd.backward imports at its first call), and /proc/self/environ shows the zygote's start environment (the
session's without HOME, USER, the cache paths and TRITON_INTERPRET; os.environ is the session's).

Not used (the launcher path as before) on CUDA (the zygote must never initialise CUDA, and the
GPU worker keeps the validator's user), under `--sandbox` (bwrap starts the launcher), when the
validator is not a subreaper, where torch's import pulled triton in (TRITON_INTERPRET is read at
triton's import), with GRPO_CONFORM_ZYGOTE=0, or when the zygote does not answer (it is then
dropped and that worker started the old way). The validator ends and reaps its zygotes at exit and
in session.end_all (SIGINT/SIGTERM); a zygote whose validator died without either ends at the EOF
of its socket.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from grpo_conform.isolation.start import SPAWN_ARGV

ENV_SWITCH = "GRPO_CONFORM_ZYGOTE"  # "0": every worker is a fresh interpreter (the launcher)
READY_TIMEOUT = 120.0  # the zygote's own start: python and torch's import on a loaded machine
FORK_TIMEOUT = 30.0
EXIT_LAUNCH = 71
PR_GET_CHILD_SUBREAPER = 37


class ZygoteStart:
    """What the spawn bootstrap unpickles in the zygote (this module imports nothing heavy at its
    top): it imports torch once, then forks a worker per request on socket `fd` (serve)."""

    def __init__(self, fd: int):
        self.fd = fd

    def _bootstrap(self, parent_sentinel: int | None = None) -> int:
        serve(self.fd)
        return 0


class Unavailable(Exception):
    """No zygote for this worker: the session starts it through the launcher."""


class Forked:
    """The part of subprocess.Popen the session uses, for a child this process did not spawn."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (reaper._alive): as Popen says then
                self.returncode = 0
                return 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode  # type: ignore[return-value]


def wanted(device: str, sandboxed: bool) -> bool:
    if device != "cpu" or sandboxed or os.environ.get(ENV_SWITCH, "1") == "0" or sys.platform != "linux":
        return False
    try:
        flag = ctypes.c_int(0)
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 1
    except OSError:
        return False


class _Zygote:
    def __init__(self, env: dict[str, str]):
        self.lock = threading.Lock()
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot_r, boot_w = os.pipe()
        tracker = os.open(os.devnull, os.O_WRONLY)
        with os.fdopen(boot_w, "wb") as w:
            pickle.dump({}, w)
            pickle.dump(ZygoteStart(child.fileno()), w)
        argv = [sys.executable, "-c", SPAWN_ARGV.format(tracker=tracker, pipe=boot_r), "--multiprocessing-fork"]
        try:
            self.proc = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, pass_fds=(child.fileno(), boot_r, tracker))
        finally:
            child.close()
            os.close(boot_r)
            os.close(tracker)
        self.sock.settimeout(READY_TIMEOUT)
        try:
            ready = json.loads(self.sock.recv(4096) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if not ready.get("ready"):
            self.close()
            raise Unavailable(ready.get("why", "the zygote did not start"))

    def fork(self, request: dict[str, Any], fds: list[int]) -> int:
        with self.lock:
            self.sock.settimeout(FORK_TIMEOUT)
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            reply = json.loads(self.sock.recv(4096) or b"{}")
        if "pid" not in reply:
            raise OSError(reply.get("why", "no answer"))
        return int(reply["pid"])

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


_ZYGOTES: dict[str, _Zygote] = {}
_DISABLED: set[str] = set()
_LOCK = threading.Lock()


def prepare(shared_env: dict[str, str]) -> str:
    """The zygote for this environment, started when there is none: call before taking the
    reaper's LOCK (the first start imports torch). Returns its key; raises Unavailable."""
    key = json.dumps(sorted(shared_env.items()))
    with _LOCK:
        if key in _DISABLED:
            raise Unavailable("the zygote failed before in this process")
        if key not in _ZYGOTES:
            try:
                _ZYGOTES[key] = _Zygote(shared_env)
            except (Unavailable, OSError) as exc:
                _DISABLED.add(key)
                raise Unavailable(str(exc)) from None
            if len(_ZYGOTES) == 1:
                atexit.register(end_all)
    return key


def end_all() -> None:
    """End and reap every zygote of this process (at exit, and with session.end_all on a signal): a
    zygote left to exit on its own at the validator's end would outlive it for a moment."""
    with _LOCK:
        zygotes = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for z in zygotes:
        z.close()


def spawn(key: str, plan: dict[str, Any], env: dict[str, str], fds: list[int], malloc: bool) -> Forked:
    """A worker forked from zygote `key` (prepare), this process's child when this returns. Call it
    holding the reaper's LOCK, so that no sweep takes the worker for an orphan before the session
    holds it. Raises Unavailable (the zygote is then dropped)."""
    zygote = _ZYGOTES.get(key)
    if zygote is None:
        raise Unavailable("no zygote")
    try:
        pid = zygote.fork({"plan": plan, "env": env, "malloc": malloc}, fds)
    except (OSError, ValueError) as exc:
        with _LOCK:
            _ZYGOTES.pop(key, None)
            _DISABLED.add(key)
        zygote.close()
        raise Unavailable(f"the zygote did not fork: {exc}") from None
    forked = Forked(pid)
    if _parent_of(pid) != os.getpid():  # not handed over (no subreaper?): this session cannot own it
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        with _LOCK:
            _DISABLED.add(key)
        raise Unavailable("the forked worker did not come back to the validator")
    return forked


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


# -- the zygote process ------------------------------------------------------------------------
def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    try:
        # imported here, in the zygote only: the point of it is to import them once, before any fork.
        # symbolic_shapes (and sympy with it): torch.autograd.backward imports it at the first backward
        # with given gradients (`_make_grads`), which every worker's first call makes: ~0.6 s each.
        import torch  # noqa: F401
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
        import grpo_conform.isolation.launch  # noqa: F401
        import grpo_conform.isolation.worker  # noqa: F401
    except BaseException as exc:  # noqa: BLE001
        sock.send(json.dumps({"why": f"import failed: {exc!r}"[:2000]}).encode())
        os._exit(1)
    if "triton" in sys.modules:  # its interpreter flag is read at import: every worker imports it itself
        sock.send(json.dumps({"why": "torch's import imported triton"}).encode())
        os._exit(1)
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except (OSError, EOFError):
            os._exit(0)
        if not data:  # the validator has gone
            os._exit(0)
        try:
            reply = {"pid": _fork(json.loads(data), fds, sock)}
        except Exception as exc:  # noqa: BLE001
            reply = {"why": f"{type(exc).__name__}: {exc}"[:2000]}
        finally:
            for f in fds:
                os.close(f)
        sock.send(json.dumps(reply).encode())


def _fork(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    if len(fds) != 3:
        raise ValueError(f"expected 3 descriptors, got {len(fds)}")
    r, w = os.pipe()
    helper = os.fork()
    if helper == 0:  # the helper: fork the worker, say its pid, leave (the worker comes back to the validator)
        try:
            os.close(r)
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _worker(request, fds, sock, me)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(helper, 0)  # the helper has exited: the worker is the validator's child now
    return int(data)


def _worker(request: dict[str, Any], fds: list[int], zygote_sock: socket.socket, helper: int) -> None:
    try:
        # `helper` from before the fork: read here, the parent may already be the validator
        deadline = time.monotonic() + 30
        while os.getppid() == helper and time.monotonic() < deadline:  # handed over to the validator
            time.sleep(0.0005)
        os.setsid()
        sock_fd, log_fd, report_fd = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        keep = sorted({0, 1, 2, sock_fd, report_fd})
        zygote_sock.detach()
        start = 3
        for k in keep:
            if k >= start:
                os.closerange(start, k)
                start = k + 1
        os.closerange(start, 1 << 16)
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile  # imported here: in the forked worker only (already loaded by torch)

        tempfile.tempdir = None  # TMPDIR is the session's now
        _reseed()  # a fresh interpreter's generators are seeded from the OS: not the zygote's copies
        # imported here: in the forked worker only (the zygote loaded them before forking)
        from grpo_conform.isolation import launch
        from grpo_conform.isolation.start import Start

        try:
            facts = launch.enter(request["plan"])
        except OSError as exc:
            print(f"grpo-conform launcher: cannot start the worker: {exc}", file=sys.stderr, flush=True)
            os._exit(EXIT_LAUNCH)
        launch._report(report_fd, facts)
        Start(sock_fd, request["malloc"])._bootstrap()
    except BaseException:  # noqa: BLE001
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(EXIT_LAUNCH)
    os._exit(0)


def _reseed() -> None:
    """torch seeds its default generator from the OS at import, numpy its legacy one at first use:
    copied by the fork, every worker of a zygote would draw the same numbers (Python's `random`
    reseeds itself after a fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
