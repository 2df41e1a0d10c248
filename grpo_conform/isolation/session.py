"""The parent side of a worker: start it unprivileged in a neutral process, talk to it with
timeouts and strict message models, and end it with every process it started.

Start-up (see launch.py and privilege.py): the implementation's files (exactly those its identity
lists, re-hashed while copied) go to a private scratch tree; the launcher drops to the worker user
and executes the interpreter with an argv like any multiprocessing spawn child
(`python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`), in a
neutral temporary directory that is also its HOME and cache root, with an allow-listed environment
(no key material, nothing named like a secret, no GRPO_CONFORM_* variables, no MALLOC_*).
Tensors go through sealed memfds (sharing.py); stdout and stderr go to an unlinked file of the
parent's, whose tail is the evidence of a crash.

Ending (reaper.py): every process the worker started is ended with it, setsid and double forks
included. `end_all` (for signal handlers) does that for every live session and removes their
scratch trees.

`sandbox="bwrap"` (sandbox.py): the launcher, and so the worker, start inside bubblewrap (no
network, a read-only file system but the scratch tree). The session's process is then bwrap's,
not the worker's: `worker_pid` is the worker as seen from here (for the privileges the parent
reads itself), and ending bwrap's tree ends the worker with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

import grpo_conform
from grpo_conform.errors import EnvironmentProblem, GrpoConformError
from grpo_conform.implementations import Implementation, ManifestError
from grpo_conform.isolation import compile_cache, live_share, messages, namespaces, privilege, sandbox as sandboxes, uids, zygote
from grpo_conform.isolation.reaper import LIVE, LOCK, end_tree, register_helper, unregister_helper  # noqa: F401
from grpo_conform.isolation.start import SPAWN_ARGV, Start as _Start
from grpo_conform.isolation.output_tail import OutputTail
from grpo_conform.isolation.sharing import SharedAllocator
from grpo_conform.phases import PHASES

STDERR_TAIL = 4000
#: The least time a worker gets to start and import the implementation: torch's own import takes
#: seconds on a loaded CI machine, more than a short per-call --timeout should have to allow.
LOAD_TIMEOUT_MIN = 30.0
_ALLOWED = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|LANG|LC_[A-Z]+|TMPDIR|TZ|LD_LIBRARY_PATH|VIRTUAL_ENV|CONDA_PREFIX|"
    r"CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|TRITON_[A-Z_]+|TORCH_[A-Z_]+|TORCHINDUCTOR_[A-Z_]+|PYTORCH_[A-Z_]+|"
    r"NCCL_[A-Z_]+|NVSHMEM_[A-Z_]+|XDG_CACHE_HOME|CC|CXX|OMP_NUM_THREADS|MKL_[A-Z_]+|SSL_CERT_FILE|"
    r"GRPO_CONFORM_WORKER_PROFILE)$"  # the last: a profiling switch (worker.PROFILE_ENV), a directory name
)
_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|SEED", re.IGNORECASE)
#: Cache locations pointed into the worker's scratch home, whatever user it runs as: the validator's
#: own caches are not writable by another user, and a shared cache would let one implementation plant
#: compiled code that another loads. Each starts from the implementation's own store and what the
#: worker adds goes back there (isolation/compile_cache.py).
_PRIVATE_CACHES = {"XDG_CACHE_HOME": ".cache", "TRITON_CACHE_DIR": ".triton", "TORCHINDUCTOR_CACHE_DIR": ".inductor",
                   "TORCH_HOME": ".torch", "TMPDIR": "tmp"}
#: What differs between two workers' environments in one validator: left out of the zygote's (zygote.py).
_PER_SESSION = frozenset({"HOME", "USER", "LOGNAME", "TRITON_INTERPRET", *_PRIVATE_CACHES})


class WorkerFailure(GrpoConformError):
    """The implementation's process did not answer as it should; `kind` says how."""

    exit_code = 1

    def __init__(self, kind: str, message: str, stderr_tail: str = "", error: dict | None = None):
        self.kind, self.stderr_tail, self.error = kind, stderr_tail, error or {}
        super().__init__(message)

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": str(self)}
        if self.error:
            out["error"] = self.error
        if self.stderr_tail:
            out["stderr_tail"] = self.stderr_tail
        return out


class ImplementationLoadError(ManifestError):
    """The implementation's module failed to import, or its entry is not a callable."""


#: Signals that end a process only when something sends them (the faults SIGSEGV, SIGBUS, SIGILL,
#: SIGFPE, SIGABRT, SIGSYS come from the process's own code and stay the implementation's crash).
SENT_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                          signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM})


class WorkerKilled(EnvironmentProblem):
    """The worker was killed by a signal the validator did not send while it loaded the
    implementation: not evidence against the implementation (issue 28: another slot's worker did
    it, before slots had uids of their own; now: the OOM killer or another root process). The run
    stops with exit 3 and blames nobody."""


def worker_environment(device: str, interpret: bool, home: Path | None = None,
                       user: str | None = None, caches: Path | None = None) -> dict[str, str]:
    """The worker's environment. `home`: a private directory that becomes HOME and the root of
    every cache (when the worker runs as another user). `caches`: without `home`, the root of every
    cache all the same (a worker that keeps the validator's user, as on CUDA where only it can open the
    parent's buffers: it reads no cache that another implementation's worker wrote; its own compiled
    kernels come back from its store, isolation/compile_cache.py)."""
    env = {k: v for k, v in os.environ.items() if _ALLOWED.match(k) and not _SECRET.search(k)}
    package_root = str(Path(grpo_conform.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in sys.path if p and os.path.isdir(p)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if home is not None:
        env["HOME"] = str(home)
    if home is not None or caches is not None:
        for key, sub in _PRIVATE_CACHES.items():
            env[key] = str((home if home is not None else caches) / sub)
    if user is not None:
        env["USER"] = env["LOGNAME"] = user
    # The CPU allocator settings (keep freed heap memory for reuse, so the poison reaches fresh
    # tensors) are applied by the worker itself with mallopt: no MALLOC_* variable to recognise.
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def end_all() -> None:
    """End every live worker with all its processes and remove every scratch tree. For the CLI's
    SIGINT/SIGTERM handling: safe to call from a signal handler's exception path, idempotent."""
    with LOCK:
        sessions = list(LIVE.values())
    for s in sessions:
        s.close(graceful=False)
    zygote.end_all()
    end_tree(None)


def copy_implementation(impl: Implementation, target: Path) -> None:
    """Copy exactly the files the identity lists, checking each one's sha256 as it is read: the
    worker can load nothing the identity does not cover (no __pycache__, nothing added since)."""
    for line in impl.listing.splitlines():
        digest, name = line.split("  ", 1)
        data = (impl.path / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise ImplementationLoadError(impl.path / name, None, "changed since the implementation was read; "
                                          "run the check again")
        dest = target / name
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        dest.write_bytes(data)
        dest.chmod(0o644)


@dataclass
class WorkerSession:
    """One worker process for one implementation. Use as a context manager."""

    impl: Implementation
    parameters: dict[str, Any]
    device: torch.device
    timeout: float
    interpret: bool = False
    user: str | None = None  # None: privilege.ENV_USER, default a uid drawn per worker (root, CPU)
    sandbox: str = "none"  # "bwrap": the worker runs inside bubblewrap (sandbox.py)
    proc: subprocess.Popen | None = None
    conn: Connection | None = None
    info: dict[str, Any] = field(default_factory=dict)
    _log: Any = None
    _sock: socket.socket | None = None
    directory: Path | None = None
    worker_pid: int | None = None  # the worker's pid here (proc.pid without a sandbox)
    _ending: bool = False  # the validator itself is ending the worker (timeout, protocol, close)
    _loading: bool = False
    _started_at: float = 0.0
    _isolation: dict[str, Any] = field(default_factory=dict)  # namespaces.describe's block
    _cache_store: Path | None = None  # this implementation's compile cache store (compile_cache.py)
    _cache_info: dict[str, Any] | None = None  # what the report says of it (info["compile_cache"])
    _sandbox_info: dict[str, Any] = field(default_factory=dict)  # sandboxes.preflight's, from spawn for load
    _warming: bool = False  # a `warm` request sent, its answer not yet read (load reads it)
    _in_store: set[str] = field(default_factory=set)  # files of the worker's caches known stored (share_compiled)

    def __post_init__(self) -> None:
        self.allocator = SharedAllocator(self.device)
        self.identity = privilege.worker_identity(self.user, self.device.type)
        sandboxes.validate(self.sandbox)

    @property
    def sandboxed(self) -> bool:
        return self.sandbox != "none"

    @property
    def compile_cache_info(self) -> dict[str, Any]:
        """What the store seeded into this worker's caches, known from `spawn` on (info["compile_cache"] after
        `load`): {"reused_files": N} or {"off": why}; {} before `spawn`."""
        return dict(self._cache_info or {})

    # -- lifetime ---------------------------------------------------------------------------
    def __enter__(self) -> "WorkerSession":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare_tree(self) -> tuple[Path, Path, Path]:
        """scratch/ (0711, root's) with src/ (the implementation, read-only to the worker), home/
        (the worker's, 0700) and .stage/ (the launcher's mount staging, parent only)."""
        base = tempfile.gettempdir()
        if privilege.blocked_ancestor(Path(base) / "x", self.identity):
            base = "/tmp"
        self.directory = Path(tempfile.mkdtemp(dir=base))
        self.directory.chmod(0o711)
        src, home = self.directory / "src", self.directory / "home"
        src.mkdir(mode=0o755)
        home.mkdir(mode=0o700)
        (home / "tmp").mkdir(mode=0o700)
        (self.directory / ".stage").mkdir(mode=0o700)
        copy_implementation(self.impl, src)
        if self.identity.drops:
            for p in (home, home / "tmp"):
                os.chown(p, self.identity.uid, self.identity.gid)
        return self.directory, src, home

    def _seed_compile_cache(self, home: Path, drops: bool) -> None:
        """The worker's compile caches from this implementation's store (isolation/compile_cache.py); what
        the record says about it: `compile_cache` {"reused_files": N} or {"off": why}."""
        try:
            self._cache_store = compile_cache.store_for(self.impl.identity, self.device.type)
            if self._cache_store is None:
                self._cache_info = {"off": f"{compile_cache.ENV_SWITCH}=0"}
                return
            reused = compile_cache.seed(self._cache_store, home, self.identity.uid if drops else None,
                                        self.identity.gid if drops else None)
            self._cache_info = {"reused_files": reused}
        except OSError as exc:
            self._cache_store = None
            self._cache_info = {"off": f"the store could not be used: {exc.strerror or exc}"}

    def start(self) -> None:
        self.spawn()
        self.load()

    def spawn(self) -> None:
        """The worker's process, up to its `load`: started and serving, no implementation code run yet.
        A timed turn spawns its worker before its exclusive hold is granted and loads it after
        (check._timed_turn): a process that holds no code of the implementation cannot help another
        slot's timed calls, so the turn's wait hides the process start."""
        # Before anything is created: a sandbox that cannot start raises SandboxUnavailable (never
        # a worker run without the sandbox that was asked for).
        sandbox_info = sandboxes.preflight(self.sandbox, self.device.type)
        privilege.harden_parent()
        with LOCK:
            LIVE[id(self)] = self
        root, src, home = self._prepare_tree()
        drops = self.identity.drops
        self._seed_compile_cache(home, drops)  # the worker's caches are private: they start from its store
        # Under the sandbox the file system is read-only but for the scratch tree, so the worker's
        # HOME and caches are its private ones also when it keeps the validator's user (CUDA).
        env = worker_environment(self.device.type, self.interpret, home if drops or self.sandboxed else None,
                                 self.identity.name if drops else None, caches=home)
        parent_sock, child_sock = socket.socketpair()
        boot_r, boot_w = os.pipe()
        tracker = os.open(os.devnull, os.O_WRONLY)
        self._log = OutputTail()  # capped in memory: no unbounded file (REPORT, issue 16)
        with os.fdopen(boot_w, "wb") as w:  # read by multiprocessing.spawn in the worker
            pickle.dump({}, w)
            pickle.dump(_Start(child_sock.fileno(), self.device.type == "cpu"), w)
        argv = [sys.executable, "-c", SPAWN_ARGV.format(tracker=tracker, pipe=boot_r), "--multiprocessing-fork"]
        report_r, report_w = os.pipe()  # the launcher's word on which namespaces it made (namespaces.py)
        want = namespaces.wanted(self.device.type, self.sandboxed)
        plan = {"uid": self.identity.uid, "gid": self.identity.gid, "cwd": str(home), "argv": argv, "env": env,
                "mounts": self._mounts(root), "stage": str(root / ".stage"), "no_capabilities": self.sandboxed,
                "ipc": want["ipc"], "report_fd": report_w,
                "hide_processes": want.get("proc", False) and self.identity.drops,
                "private": (privilege.private_scratch_mounts(root, self.device.type, self.sandboxed)
                            if want["mounts"] else [])}
        command = [sys.executable, "-m", "grpo_conform.isolation.launch", json.dumps(plan)]
        if self.sandboxed:
            # The privilege drop happens inside bwrap, in the launcher (see sandbox.py for why): bwrap
            # starts with the validator's privileges, needs no user namespace when that is root, and
            # the worker keeps a real unprivileged uid. The file descriptors in pass_fds (socket,
            # boot pipe, tracker) are inherited through bwrap into the launcher and the worker.
            command = sandboxes.bwrap_arguments(sandbox_info["binary"], root, src, self.device.type) + command
        self._started_at = time.time()
        zygote_key = self._zygote(env)
        try:
            with LOCK:
                if zygote_key is not None:  # a fork of the zygote that imported torch once (zygote.py)
                    try:
                        self.proc = zygote.spawn(zygote_key, plan, env, [child_sock.fileno(), self._log.write_fd,
                                                                         report_w], malloc=True)
                    except zygote.Unavailable:
                        pass
                if self.proc is None:
                    self.proc = subprocess.Popen(
                        command, env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=self._log.write_fd,
                        stderr=subprocess.STDOUT, pass_fds=(child_sock.fileno(), boot_r, tracker, report_w),
                        start_new_session=True)
        finally:
            child_sock.close()
            os.close(boot_r)
            os.close(tracker)
            os.close(report_w)
            self._log.started()
        facts = namespaces.read_report(report_r)
        self._sock = parent_sock
        self.conn = Connection(os.dup(parent_sock.fileno()))
        self.worker_pid = self.proc.pid
        if self.sandboxed:  # found before `load`: no implementation code has run, nothing else is there yet
            self.worker_pid = sandboxes.find_worker(self.proc.pid, self.device.type,
                                                    lambda: self.proc is not None and self.proc.poll() is None)
        self._isolation = namespaces.describe(facts, self.identity, self.device.type, self.sandbox)
        self._sandbox_info = sandbox_info

    def warm(self) -> None:
        """Asks the spawned worker, without waiting for its answer, to make its imports (worker.op_warm:
        validator code only, nothing on the GPU); `load` collects the answer first."""
        self._send({"op": "warm", "device": self.device.type})
        self._warming = True

    def load(self) -> None:
        """The implementation imported in the spawned worker (`spawn`), its entry found."""
        sandbox_info = self._sandbox_info
        self._loading = True  # the warm answer too: inside the caller's worker-start, as the load
        if self._warming:
            self._warming = False
            self.receive(max(self.timeout, LOAD_TIMEOUT_MIN), op="warm")
        assert self.directory is not None, "spawn() first"
        src = self.directory / "src"
        self.info = self.request(timeout=max(self.timeout, LOAD_TIMEOUT_MIN), op="load", folder=str(src),
                                 name=self.impl.name, entry=self.impl.manifest.entry, parameters=self.parameters,
                                 device=self.device.type).get("info", {})
        self._loading = False
        self.info["user"] = self.identity.to_json()
        self.info["isolation"] = self._isolation  # the same dict: close() adds what the fallback removed
        self.info["sandbox"] = sandbox_info
        if self._cache_info is not None:
            self.info["compile_cache"] = self._cache_info
        self.info["privileges"] = (privilege.observed_privileges(self.worker_pid) if self.worker_pid is not None
                                   else {"error": "the sandboxed worker process was not found"})

    def share_compiled(self) -> None:
        """Between two requests: the kernels this worker compiled go to its implementation's store, and the
        store's kernels it lacks (compiled meanwhile by another slot's worker) into its cache
        (isolation/live_share.py). The report counts the kernel folders it received (`shared_kernels`)."""
        if self._cache_store is None or self.directory is None or not self.alive:
            return
        home, drops = self.directory / "home", self.identity.drops
        try:
            compile_cache.harvest(home, self._cache_store, self._in_store)
            copied = live_share.top_up(self._cache_store, home, self.identity.uid if drops else None,
                                       self.identity.gid if drops else None)
        except OSError:
            return  # a full disk or a removed store costs compile time, nothing else
        if copied and self._cache_info is not None:
            self._cache_info["shared_kernels"] = self._cache_info.get("shared_kernels", 0) + copied

    def _zygote(self, env: dict[str, str]) -> str | None:
        """The zygote's key where this worker can be forked from one (zygote.py), else None."""
        if not zygote.wanted(self.device.type, self.sandboxed):
            return None
        shared = {k: v for k, v in env.items() if k not in _PER_SESSION}
        try:
            return zygote.prepare(shared)
        except zygote.Unavailable:
            return None

    def _mounts(self, root: Path) -> list[dict[str, Any]]:
        """The mounts without which the worker cannot start (directories its user cannot enter); the
        private writable places follow them in the plan's `private` (refusable, then swept)."""
        return privilege.mount_plan(self.identity) if self.identity.drops else []

    def close(self, graceful: bool = True) -> None:
        left_normally = False
        if graceful and self.proc is not None and self.proc.poll() is None and self.conn is not None:
            try:
                self._send({"op": "exit"})
                left_normally = self.proc.wait(timeout=10) == 0
            except (OSError, subprocess.TimeoutExpired, WorkerFailure):
                pass
            except Exception:  # _send's synchronize on a CUDA context an earlier error left unusable: end it below
                pass
        self._kill()
        if self.proc is not None:  # every process of the worker has ended: sweep what it left outside
            namespaces.clean_up(self._isolation, self.identity, self._started_at)
        if left_normally and self._cache_store is not None and self.directory is not None:
            try:  # after every process of the worker has ended: nothing under HOME changes any more
                compile_cache.harvest(self.directory / "home", self._cache_store)
            except OSError:
                pass  # a full disk or a removed store costs the next run its compile time, nothing else
        if self.identity.drawn:
            uids.release(self.identity.uid)
        for c in (self.conn, self._sock, self._log):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self.conn = self._sock = self._log = None
        self.allocator.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        with LOCK:
            LIVE.pop(id(self), None)

    def _kill(self) -> None:
        if self.proc is None:
            return
        self._ending = True
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        end_tree(self.proc.pid)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        end_tree(None)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    # -- messages ---------------------------------------------------------------------------
    def stderr_tail(self) -> str:
        if self._log is None:
            return ""
        return self._log.tail(STDERR_TAIL)

    def _send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        if self.conn is None:
            raise WorkerFailure("crash", "the worker is not running")
        if self.device.type == "cuda":
            # The parent's writes into shared CUDA memory (inputs generated, rewritten, restored or
            # poisoned) are asynchronous, and the worker is another process with its own streams:
            # nothing orders its reads after them but this. Without it the worker read rows the parent
            # had not written yet (input-layouts failed Triton and Liger at seed-b8/b16 on the H200,
            # 2026-12-01: wrong targets and stale rows in the last-written views).
            import torch

            torch.cuda.synchronize(self.device)
        try:
            self.conn.send_bytes(json.dumps(msg).encode())
            if fds:
                socket.send_fds(self._sock, [b"F"], fds)
        except OSError:
            raise self._died() from None

    def _died(self) -> WorkerFailure | WorkerKilled:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
                code = self.proc.returncode
        self.conn = None
        end_tree(self.proc.pid if self.proc is not None else None)
        sent = None
        if code is not None and code < 0:
            how, sent = f"killed by signal {signal.Signals(-code).name}", -code
        elif code is not None and self.sandboxed and sandboxes.exit_reason(code):
            how, sent = sandboxes.exit_reason(code), code - 128
        else:
            how = f"exited with status {code}"
        if self._loading and not self._ending and sent in SENT_SIGNALS:
            return WorkerKilled(
                f"the worker of {self.impl.name} was {how} while loading it, and the validator did not send it: "
                "something outside the check ended it (the kernel's OOM killer, another root process), or the "
                "implementation killed itself at import; no verdict is given. Run the check again (alone, or with "
                "fewer --jobs); the worker's output: " + (self.stderr_tail()[-500:] or "none"))
        return WorkerFailure("crash", f"the implementation's process {how}", self.stderr_tail())

    def _protocol(self, reason: str) -> WorkerFailure:
        """A reply that breaks the protocol: the stream cannot be trusted any more, end the worker."""
        self._kill()
        self.conn = None
        return WorkerFailure("protocol", f"the worker broke the message protocol: {reason}", self.stderr_tail())

    def receive(self, timeout: float | None = None, op: str = "?") -> dict[str, Any]:
        try:
            return self._receive(timeout, op)
        except (KeyboardInterrupt, SystemExit):
            self._abandon()
            raise
        except BaseException as exc:  # e.g. the CLI's Terminated (SIGTERM): not an Exception either
            if not isinstance(exc, Exception):
                self._abandon()
            raise

    def _abandon(self) -> None:
        """An interrupt arrived while waiting: end the worker now, so that no `finally` block
        waits for a reply from an implementation that is still busy."""
        try:
            self._kill()
        finally:
            self.conn = None

    def _receive(self, timeout: float | None, op: str) -> dict[str, Any]:
        timeout = self.timeout if timeout is None else timeout
        if self.conn is None:
            raise WorkerFailure("crash", "the worker is not running")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                self.conn = None
                raise WorkerFailure("timeout", f"no answer within {timeout:g} s: process killed", self.stderr_tail())
            try:
                ready = self.conn.poll(min(remaining, 0.5))
            except (OSError, EOFError):
                raise self._died() from None
            if ready:
                try:
                    raw = self.conn.recv_bytes(maxlength=64 << 20)
                except (OSError, EOFError):
                    raise self._died() from None
                try:
                    msg = json.loads(raw.decode())
                except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                    raise self._protocol("a reply that is not JSON") from None
                try:
                    parsed, checked = messages.parse_reply(op, msg)
                except messages.MalformedReply as exc:
                    raise self._protocol(str(exc)) from None
                return self._checked(parsed, checked)
            if self.proc is not None and self.proc.poll() is not None:
                raise self._died()

    def _checked(self, parsed: Any, msg: dict[str, Any]) -> dict[str, Any]:
        if isinstance(parsed, messages.ErrorReply):
            err = parsed.error
            if err.phase == "import" or parsed.field == "entry":
                where = f" ({err.where})" if err.where else ""
                raise ImplementationLoadError(
                    self.impl.path / "implementation.toml", "entry",
                    f"cannot load {self.impl.manifest.entry}: {err.type}: {err.message}{where}",
                )
            if parsed.fatal:
                self._kill()
                self.conn = None
            kind = "cuda-error" if parsed.fatal else "exception"
            text = f"{err.phase} raised {err.type}: {err.message}"
            if err.where:
                text += f" at {err.where}"
            # The output tail goes with every exception: what the implementation printed is often the clue.
            raise WorkerFailure(kind, text, self.stderr_tail(), err.model_dump())
        return msg

    def post(self, **msg: Any) -> None:
        """Sends a request without waiting; `answered` says when `receive` will not wait (check_ahead.py)."""
        self._send(msg)

    def answered(self) -> bool:
        try:
            return self.conn is not None and self.conn.poll(0)
        except (OSError, EOFError):
            return True  # `receive` reports how it died

    def request(self, timeout: float | None = None, **msg: Any) -> dict[str, Any]:
        # docs/timing.md, "Validator time"; the load is inside the caller's `worker-start`
        with (contextlib.nullcontext() if self._loading else PHASES(PHASES.worker_phase(str(msg.get("op", "?"))))):
            self._send(msg)
            return self.receive(timeout, op=msg.get("op", "?"))

    # -- operations -------------------------------------------------------------------------
    def bind(self, slot: str, tensors: dict[str, dict[str, Any]]) -> None:
        """Bind descriptors to a slot; memfd descriptors travel with their file descriptors."""
        fds = self.allocator.fds_for(tensors)
        if self.identity.drops:
            for d in tensors.values():  # torch creates its IPC ref-counter files 0600 for the parent
                counter = d.get("ref_counter") if d.get("kind") == "cuda_ipc" else None
                if isinstance(counter, str) and "/" not in counter[1:] and os.path.exists("/dev/shm" + counter):
                    os.chown("/dev/shm" + counter, self.identity.uid, self.identity.gid)
        with PHASES(PHASES.worker_phase("bind")):
            self._send({"op": "bind", "slot": slot, "tensors": tensors, "nfds": len(fds)}, fds)
            self.receive(op="bind")
