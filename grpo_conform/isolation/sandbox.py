"""`--sandbox bwrap`: the worker started inside bubblewrap (issue 11, item 9).

Without a sandbox (`none`, the default) the worker is isolated as session.py describes: its own
process, another user when the validator is root, a private /tmp and (CPU) /dev/shm. With
`bwrap` the launcher and the worker run inside `bwrap` (Debian/Ubuntu package `bubblewrap`):

- `--unshare-net`: a network namespace of its own with only a loopback interface: no connection
  leaves it, not even to the host's loopback or abstract unix sockets;
- `--ro-bind / /`: the whole file system read-only, except the session's scratch tree (bound
  writable: the worker's HOME, TMPDIR and caches), with the copy of the implementation in it bound
  read-only again; `/tmp` a private tmpfs; `/proc` a fresh procfs; `/dev` a minimal devtmpfs
  (null, zero, full, random, urandom, tty, pts; on CUDA also the /dev/nvidia* nodes and the
  host's /dev/shm, where torch keeps its CUDA IPC reference counters);
- on the CPU also `--unshare-pid` and `--unshare-ipc`: the worker sees no process but its own
  descendants (not the validator: it cannot address it by pid) and everything in the namespace
  dies with it. Not on CUDA: legacy CUDA IPC handles cannot be opened across PID namespaces;
- `--die-with-parent` (bwrap and the sandboxed processes are SIGKILLed when the validator dies)
  and `--new-session` (no terminal to inject input into).

Where the privilege drop happens: inside bwrap, in the launcher, as without a sandbox. bwrap is
started with the validator's privileges; run by root it needs no user namespace (which many
kernels and containers refuse to unprivileged users) and keeps its capabilities for the
launcher, which then builds its own mounts and drops to the worker user exactly as before (uid,
gid, groups, empty bounding set, no_new_privs), so the worker keeps a real unprivileged host uid
rather than one mapped inside a user namespace. Under the sandbox the launcher also empties the
bounding set when the worker stays the validator's user (root on CUDA): it then runs with no
capability, so it cannot remount the read-only file system or ptrace anything. A validator that is
not root runs bwrap unprivileged, which then uses a user namespace (where the kernel allows it).

If bwrap is missing or cannot create its namespaces here, `check --sandbox bwrap` fails before
anything runs (`SandboxUnavailable`, exit 2); it never runs the worker unsandboxed.
`GRPO_CONFORM_BWRAP` names the bwrap binary (default /usr/bin/bwrap, else `bwrap` on PATH).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from grpo_conform.errors import EXIT_USAGE, GrpoConformError
from grpo_conform.isolation.reaper import proc_stats

SANDBOXES = ("none", "bwrap")
ENV_BWRAP = "GRPO_CONFORM_BWRAP"
DEFAULT_BWRAP = "/usr/bin/bwrap"
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) "
                f"or set {ENV_BWRAP} to a bwrap binary")
PROBE_TIMEOUT = 60.0


class SandboxUnavailable(GrpoConformError):
    """`--sandbox bwrap` asked for, and bwrap is missing or cannot start here: nothing runs."""

    exit_code = EXIT_USAGE


def validate(kind: str) -> str:
    if kind not in SANDBOXES:
        raise SandboxUnavailable(f"--sandbox {kind!r}: expected one of {', '.join(SANDBOXES)}")
    return kind


def bwrap_binary() -> str:
    """The bwrap to run: $GRPO_CONFORM_BWRAP, else /usr/bin/bwrap, else `bwrap` on PATH."""
    setting = os.environ.get(ENV_BWRAP, "").strip()
    if setting:
        candidate = setting if os.sep in setting else (shutil.which(setting) or setting)
        where = f"{candidate} (from {ENV_BWRAP})"
    else:
        candidate = DEFAULT_BWRAP if os.path.exists(DEFAULT_BWRAP) else (shutil.which("bwrap") or DEFAULT_BWRAP)
        where = f"{candidate}, nor bwrap on PATH" if candidate == DEFAULT_BWRAP else candidate
    if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        raise SandboxUnavailable(f"--sandbox bwrap: bubblewrap (bwrap) is not installed here (no executable at "
                                 f"{where}); {INSTALL_HINT}. Nothing was run: the check never runs the worker "
                                 "unsandboxed when a sandbox was asked for")
    return os.path.abspath(candidate)


def uses_pid_namespace(device: str) -> bool:
    """A PID namespace on the CPU only: legacy CUDA IPC handles do not open across PID namespaces."""
    return device != "cuda"


def _cuda_nodes() -> list[str]:
    try:
        return sorted(str(Path("/dev") / n) for n in os.listdir("/dev") if n.startswith("nvidia"))
    except OSError:
        return []


def bwrap_arguments(binary: str, scratch: Path | None, src: Path | None, device: str) -> list[str]:
    """bwrap and its options, up to (not including) the command it runs."""
    args = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    if device == "cuda":
        for node in _cuda_nodes():  # the GPUs, nvidiactl, nvidia-uvm, nvidia-caps/
            args += ["--dev-bind", node, node]
        if os.path.isdir("/dev/shm"):  # torch's CUDA IPC reference counters live there
            args += ["--bind", "/dev/shm", "/dev/shm"]
    if scratch is not None:
        args += ["--bind", str(scratch), str(scratch)]
    if src is not None:
        args += ["--ro-bind", str(src), str(src)]
    args += ["--unshare-net"]
    if uses_pid_namespace(device):
        args += ["--unshare-pid", "--unshare-ipc"]
    args += ["--die-with-parent", "--new-session", "--"]
    return args


_PROBED: dict[tuple[str, str], str] = {}
_PROBE_LOCK = threading.Lock()


def preflight(kind: str, device: str) -> dict[str, Any]:
    """Check that the sandbox can start here (once per binary and device kind); what the records say
    about it. Raises SandboxUnavailable (exit 2) when it cannot: the check then runs nothing."""
    validate(kind)
    if kind == "none":
        return {"kind": "none"}
    binary = bwrap_binary()
    with _PROBE_LOCK:
        version = _PROBED.get((binary, device))
        if version is None:
            version = _probe(binary, device)
            _PROBED[(binary, device)] = version
    return describe(binary, version, device)


def describe(binary: str, version: str, device: str) -> dict[str, Any]:
    return {"kind": "bwrap", "binary": binary, "version": version, "network": "none (own network namespace)",
            "filesystem": "read-only, except the scratch directory and a private /tmp",
            "pid_namespace": uses_pid_namespace(device)}


def _probe(binary: str, device: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT)
        version = (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else "unknown"
        command = bwrap_arguments(binary, None, None, device) + [sys.executable, "-S", "-c", ""]
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise SandboxUnavailable(f"--sandbox bwrap: {binary} did not start a sandbox within {PROBE_TIMEOUT:g} s; "
                                 "nothing was run") from None
    except OSError as exc:
        raise SandboxUnavailable(f"--sandbox bwrap: cannot run {binary}: {exc.strerror or exc}; {INSTALL_HINT}. "
                                 "Nothing was run") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout or "").strip().splitlines()[-3:])[:500] or "no message"
        raise SandboxUnavailable(
            f"--sandbox bwrap: bubblewrap ({binary}) cannot create its sandbox here (exit {done.returncode}: {said}); "
            "bwrap needs root, or unprivileged user namespaces allowed (kernel.unprivileged_userns_clone, "
            "user.max_user_namespaces; in a container: CAP_SYS_ADMIN, or a seccomp/AppArmor profile that allows "
            "unshare). Nothing was run: the check never runs the worker unsandboxed when a sandbox was asked for")
    return version


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _first_child(pid: int) -> int | None:
    """The child of `pid` that started first (the one bwrap started; anything the implementation
    forks later starts later), or None."""
    children = [(int(fields[19]), child) for child, fields in proc_stats() if int(fields[1]) == pid]
    return min(children)[1] if children else None


def find_worker(bwrap_pid: int, device: str, alive, timeout: float = 30.0) -> int | None:
    """The worker's pid as this process sees it: bwrap's child, or with a PID namespace the child of
    bwrap's init. Called before the worker is told to load anything, so no implementation code has
    run yet and the first child is the one bwrap started. `alive()`: False once bwrap has exited."""
    depth = 2 if uses_pid_namespace(device) else 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        pid: int | None = bwrap_pid
        for _ in range(depth):
            pid = _first_child(pid) if pid is not None else None
        if pid is not None:
            return pid
        time.sleep(0.005)
    return None


def exit_reason(code: int) -> str | None:
    """bwrap reports a command killed by signal N as exit status 128 + N."""
    if 128 < code < 128 + 65:
        try:
            return f"killed by signal {signal.Signals(code - 128).name} (bwrap's exit status {code})"
        except ValueError:
            return None
    return None
