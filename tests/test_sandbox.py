"""`check --sandbox bwrap` (issue 11, item 9): the worker inside bubblewrap.

An honest implementation passes under it (and the report and the evidence record say which sandbox
ran); the gallery's `escapes-sandbox` writes outside its scratch directory and connects to a socket
of the host's network namespace: refused under the sandbox (it is stopped: `runs` fails), both done
without it; a timeout ends bwrap, the worker and everything it started, with and without a PID
namespace (the CUDA layout has none); a missing or broken bwrap is a clear usage error (exit 2)
and nothing runs unsandboxed. Skipped where bwrap is absent or cannot create namespaces, except
the tests of that error, which need no bwrap.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import GALLERY, ROOT, cli_here, process_gone
from worker_steps import call_once
from grpo_conform.implementations import MANIFEST, load_implementation
from grpo_conform.isolation import sandbox
from grpo_conform.isolation.session import WorkerFailure, WorkerSession

PYTORCH = ROOT / "implementations" / "pytorch"
ESCAPES = GALLERY / "escapes-sandbox"
OUTSIDE = Path("/var/tmp")  # where escapes-sandbox writes: outside the scratch tree and the private /tmp


def _problem() -> str | None:
    try:
        sandbox.preflight("bwrap", "cpu")
    except sandbox.SandboxUnavailable as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def bwrap():
    problem = _problem()
    if problem:
        pytest.skip(f"bwrap cannot start here: {problem}")
    return sandbox.bwrap_binary()


# -- no bwrap, or one that cannot start: exit 2, nothing runs --------------------------------------
def test_a_missing_bwrap_is_a_clear_error_and_nothing_runs(tmp_path):
    missing = tmp_path / "no-such-bwrap"
    run = cli_here("check", PYTORCH, "--device", "cpu", "--member", "token-is", "--workload", "small-bf16", "--no-evidence",
                   "--sandbox", "bwrap", env_extra={sandbox.ENV_BWRAP: str(missing)})
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    message = run.stderr
    assert "bwrap" in message and str(missing) in message and "apt-get install bubblewrap" in message
    assert "starting worker" not in message  # refused before any worker, never run unsandboxed


def test_a_bwrap_that_cannot_create_namespaces_is_a_clear_error(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'bubblewrap 0.0-fake'; exit 0; }\n"
                    "echo 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    run = cli_here("check", PYTORCH, "--device", "cpu", "--member", "token-is", "--workload", "small-bf16", "--no-evidence",
                   "--sandbox", "bwrap", env_extra={sandbox.ENV_BWRAP: str(fake)})
    assert run.returncode == 2, run.stderr[-2000:]
    assert "cannot create its sandbox" in run.stderr and "No permissions to creating new namespace" in run.stderr
    assert "starting worker" not in run.stderr


def test_the_library_raises_and_a_session_refuses_to_start_unsandboxed(tmp_path, monkeypatch):
    from grpo_conform.check import CheckRequest, run_check

    monkeypatch.setenv(sandbox.ENV_BWRAP, str(tmp_path / "absent"))
    with pytest.raises(sandbox.SandboxUnavailable, match="not installed") as info:
        run_check(CheckRequest((str(PYTORCH),), device="cpu", members=("token-is",), workloads=("small-bf16",),
                               sandbox="bwrap"))
    assert info.value.exit_code == 2
    session = WorkerSession(load_implementation(PYTORCH), {}, torch.device("cpu"), 30.0, sandbox="bwrap")
    with pytest.raises(sandbox.SandboxUnavailable):
        session.start()
    assert session.proc is None and session.directory is None  # nothing started, nothing created
    with pytest.raises(sandbox.SandboxUnavailable, match="expected one of none, bwrap"):
        WorkerSession(load_implementation(PYTORCH), {}, torch.device("cpu"), 30.0, sandbox="docker")


def test_the_option_reaches_the_slot_processes():
    from grpo_conform.check import CheckRequest
    from grpo_conform.gate.parallel import _slot_request

    fields = _slot_request(CheckRequest((str(PYTORCH),), sandbox="bwrap", jobs=2), [(str(PYTORCH), "token-is",
                                                                                      "small-bf16")], "cpu")
    assert fields["sandbox"] == "bwrap"
    assert CheckRequest(**{**fields, "paths": tuple(fields["paths"])}).sandbox == "bwrap"


def test_the_cuda_layout_binds_the_gpus_and_keeps_one_pid_namespace(monkeypatch):
    monkeypatch.setattr(sandbox, "_cuda_nodes", lambda: ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"])
    cuda = sandbox.bwrap_arguments("/usr/bin/bwrap", Path("/tmp/s"), Path("/tmp/s/src"), "cuda")
    cpu = sandbox.bwrap_arguments("/usr/bin/bwrap", Path("/tmp/s"), Path("/tmp/s/src"), "cpu")
    for args in (cuda, cpu):
        text = " ".join(args)
        assert "--ro-bind / /" in text and "--unshare-net" in text and "--die-with-parent" in text
        assert "--new-session" in text and "--bind /tmp/s /tmp/s" in text and "--ro-bind /tmp/s/src /tmp/s/src" in text
        assert text.index("--tmpfs /tmp") < text.index("--bind /tmp/s /tmp/s")  # the scratch on top of the tmpfs
        assert args[-1] == "--"
    assert "--dev-bind /dev/nvidia0 /dev/nvidia0" in " ".join(cuda) and "--bind /dev/shm /dev/shm" in " ".join(cuda)
    assert "--unshare-pid" not in cuda  # legacy CUDA IPC handles do not open across PID namespaces
    assert "--unshare-pid" in cpu and "nvidia" not in " ".join(cpu)


# -- an honest implementation passes; the records say which sandbox ran -------------------------------
@pytest.mark.slow
def test_an_honest_implementation_passes_under_the_sandbox(bwrap, tmp_path):
    from grpo_conform.evidence.dsse import parse_envelope
    from grpo_conform.evidence.statement import schema_problems

    # the validator in this process (cli_here; the sandboxed worker is bwrap's process either way)
    run = cli_here("check", PYTORCH, "--device", "cpu", "--member", "token-is", "--workload", "small-bf16",
                   "--sandbox", "bwrap", "--format", "json", "--evidence-dir", tmp_path / "ev")
    assert run.returncode == 0, run.stderr[-3000:]
    (impl,) = json.loads(run.stdout)["implementations"]
    assert impl["status"] == "conformant"
    worker = impl["worker"]
    assert worker["sandbox"]["kind"] == "bwrap" and worker["sandbox"]["binary"] == bwrap
    assert worker["sandbox"]["pid_namespace"] is True
    privileges = worker["privileges"]
    assert privileges["capabilities"] == "none" and privileges["no_new_privs"] is True  # read by the parent
    if os.getuid() == 0:  # the drop still happens (inside bwrap): the worker is not root
        assert privileges["uid"][0] == worker["user"]["uid"] != 0
    (record,) = (tmp_path / "ev").rglob("*.intoto.json")
    statement = json.loads(parse_envelope(record.read_bytes()).payload)
    assert statement["predicate"]["run"]["sandbox"] == "bwrap"
    assert schema_problems(statement) == []
    # the text report says it where the verdict is read
    from rich.console import Console

    from grpo_conform.check import CheckReport
    from grpo_conform.gate.merge import impl_from_json
    from grpo_conform.render import render_check

    console = Console(record=True, width=200)
    render_check(CheckReport({"kind": "cpu"}, True, (impl_from_json(impl),), {}, "", ""), console)
    assert "sandbox: bwrap" in console.export_text()


# -- escapes-sandbox: refused under the sandbox, done without it -----------------------------------
class _Listener:
    """The abstract unix socket escapes-sandbox connects to, in this (the host's) network namespace."""

    def __init__(self, name: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(name)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.received: list[bytes] = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self.received.append(conn.recv(64))
                except OSError:
                    pass

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.sock.close()


def _escaped_files() -> set[Path]:
    return set(OUTSIDE.glob("grpo-conform-escaped-*"))


@pytest.mark.slow
def test_the_sandbox_stops_what_succeeds_without_it(bwrap):
    from grpo_conform.check import CheckRequest, run_check

    if not OUTSIDE.is_dir():
        pytest.skip(f"{OUTSIDE} does not exist here")
    name = "\0grpo-conform-sandbox-probe"  # as in tests/gallery/escapes-sandbox/impl.py
    try:
        listener = _Listener(name)
    except OSError as exc:
        pytest.skip(f"cannot listen on the probe socket: {exc}")
    before = _escaped_files()
    created: set[Path] = set()
    try:
        boxed = run_check(CheckRequest((str(ESCAPES),), device="cpu", workloads=("odd-vocab",), sandbox="bwrap"))
        assert boxed.exit_code == 1
        (impl,) = boxed.implementations
        runs = next(o for w in impl.workloads for o in w.outcomes if o.check == "runs")
        assert runs.status == "error", runs.message
        assert "escape refused" in runs.message
        assert "Read-only file system" in runs.message  # the write outside the scratch directory
        assert "Connection refused" in runs.message  # the host's socket is not in its network namespace
        assert _escaped_files() == before and listener.received == []

        free = run_check(CheckRequest((str(ESCAPES),), device="cpu", workloads=("odd-vocab",)))
        created = _escaped_files() - before
        (impl,) = free.implementations
        assert free.exit_code == 0, impl.message  # the same attempts, not refused: it runs (and passes)
        # Without bwrap the write to /var/tmp lands in the worker's private tmpfs since issue 28: it
        # succeeds there and is gone with the worker; the socket still reaches the host (no network
        # namespace without bwrap), which is what the sandbox adds.
        assert not created, "a file the worker wrote to /var/tmp outlived it"
        deadline = time.monotonic() + 5
        while not listener.received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b"escaped" in listener.received
    finally:
        listener.close()
        for f in created | (_escaped_files() - before):
            f.unlink(missing_ok=True)


# -- a timeout ends bwrap, the worker and all it started ----------------------------------------------
HANGS_WITH_SURVIVORS = textwrap.dedent("""\
    import subprocess, sys, time

    def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
        subprocess.Popen(["sleep", "{secs}"], start_new_session=True)  # a setsid child
        code = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep({secs})\\nos._exit(0)\\n"
        subprocess.run([sys.executable, "-c", code])  # a double-forked setsid grandchild
        time.sleep(600)
""")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


_gone = process_gone


class _Watch:
    """Collects, while it runs, the pids of the processes the implementation started (from outside)."""

    def __init__(self, secs: int):
        self.secs, self.seen, self.stop = secs, set(), False
        # Processes that match before the implementation ran are not its own: survivors of an earlier
        # run on this machine (a killed validator's sleepers live for their 600 s) made later runs fail.
        self.before = {int(p) for p in os.listdir("/proc") if p.isdigit() and self.match(int(p))}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def match(self, pid: int) -> bool:
        line = _cmdline(pid)
        return line == f"sleep\x00{self.secs}\x00" or f"time.sleep({self.secs})" in line

    def _run(self) -> None:
        while not self.stop:
            self.seen |= {int(p) for p in os.listdir("/proc") if p.isdigit() and self.match(int(p))} - self.before
            time.sleep(0.1)

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)


@pytest.mark.slow
@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pid-namespace", "cuda-layout"])
def test_a_timeout_ends_bwrap_the_worker_and_its_descendants(bwrap, tmp_path, monkeypatch, pid_namespace):
    monkeypatch.setattr(sandbox, "uses_pid_namespace", lambda device: pid_namespace)
    secs = 614 if pid_namespace else 615
    folder = tmp_path / "hangs-with-survivors"
    folder.mkdir()
    (folder / MANIFEST).write_text('name = "hangs-with-survivors"\nspec = "grpo-token-is"\nentry = "impl:grpo_loss"\n'
                                   'language = "python"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "x"\n')
    (folder / "impl.py").write_text(HANGS_WITH_SURVIVORS.format(secs=secs))
    # A call timeout of 4 s (8 s until 2026-12-03): the call starts its two descendants within its first
    # ~0.1 s (a Popen and a `python -c` without torch), then sleeps; the test needs them started and the
    # call ended by the timeout, not any length of it (the worker's start is under the load's own least time).
    session = WorkerSession(load_implementation(folder), {"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0},
                            torch.device("cpu"), 4.0, sandbox="bwrap")
    watch = _Watch(secs)
    try:
        session.start()
        bwrap_pid, worker_pid = session.proc.pid, session.worker_pid
        assert worker_pid is not None and worker_pid != bwrap_pid
        assert "--multiprocessing-fork" in _cmdline(worker_pid)  # the worker found from outside, not bwrap's init
        g = torch.Generator().manual_seed(0)
        descriptors = {}
        for name, t in {"logits": torch.randn(1, 2, 11, generator=g).to(torch.bfloat16),
                        "completion_ids": torch.tensor([[3]]), "advantages": torch.tensor([0.5])}.items():
            _, descriptors[name] = session.allocator.share(t)
        session.bind("in", descriptors)  # memfds through SCM_RIGHTS into the sandbox
        started = time.monotonic()
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
        assert info.value.kind == "timeout" and time.monotonic() - started < 40
    finally:
        session.close()
        watch.close()
    assert len(watch.seen) >= 2, "the implementation did not start its setsid child and grandchild"
    pids = [bwrap_pid, worker_pid, *watch.seen]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), [(p, _cmdline(p)) for p in pids if not _gone(p)]


# -- a worker that keeps the validator's user (root on CUDA) runs with no capability ------------------
REACH = textwrap.dedent("""\
    import ctypes, json, os

    def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
        out = {{}}
        for mode in ("rb", "r+b"):
            try:
                open(f"/proc/{validator}/mem", mode).close()
                out["mem_" + mode] = "opened"
            except OSError as exc:
                out["mem_" + mode] = exc.errno
        libc = ctypes.CDLL(None, use_errno=True)
        out["ptrace"] = [libc.ptrace(16, {validator}, 0, 0), ctypes.get_errno()]  # PTRACE_ATTACH
        try:
            os.kill({validator}, 0)
            out["signal"] = "delivered"
        except OSError as exc:
            out["signal"] = exc.errno
        try:
            open({package!r}, "a").close()
            out["write_package"] = "opened"
        except OSError as exc:
            out["write_package"] = exc.errno
        out["uid"] = os.getuid()
        out["CapEff"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
        raise ValueError(json.dumps(out))
""")


@pytest.mark.skipif(os.getuid() != 0, reason="a worker keeping the validator's user is root only when the validator is")
@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pid-namespace", "cuda-layout"])
def test_a_root_worker_under_the_sandbox_has_no_capability(bwrap, tmp_path, monkeypatch, pid_namespace):
    import errno

    import grpo_conform

    monkeypatch.setattr(sandbox, "uses_pid_namespace", lambda device: pid_namespace)
    package = str(Path(grpo_conform.__file__).resolve())
    folder = tmp_path / "reach"
    folder.mkdir()
    (folder / MANIFEST).write_text('name = "reach"\nspec = "grpo-token-is"\nentry = "impl:grpo_loss"\n'
                                   'language = "python"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "x"\n')
    (folder / "impl.py").write_text(REACH.format(validator=os.getpid(), package=package))
    with WorkerSession(load_implementation(folder), {"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0},
                       torch.device("cpu"), 60.0, user="root", sandbox="bwrap") as session:
        assert session.info["privileges"]["capabilities"] == "none"
        g = torch.Generator().manual_seed(0)
        descriptors = {}
        for name, t in {"logits": torch.randn(1, 2, 11, generator=g).to(torch.bfloat16),
                        "completion_ids": torch.tensor([[3]]), "advantages": torch.tensor([0.5])}.items():
            _, descriptors[name] = session.allocator.share(t)
        session.bind("in", descriptors)
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
    out = json.loads(info.value.error["message"])
    assert out["uid"] == 0 and int(out["CapEff"], 16) == 0
    assert out["write_package"] == errno.EROFS  # the validator's code: read-only
    if pid_namespace:  # the validator is not in its PID namespace: nothing to open, trace or signal
        assert out["mem_rb"] == out["mem_r+b"] == errno.ENOENT and out["signal"] == errno.ESRCH
    else:  # CUDA layout: visible, but non-dumpable and the worker has no CAP_SYS_PTRACE
        assert out["mem_rb"] == out["mem_r+b"] == errno.EACCES and out["ptrace"][0] == -1
        assert out["signal"] == "delivered"  # same uid: the limit docs/checks.md states


# -- SIGKILL of the validator itself: on the CPU nothing survives (bwrap, then its PID namespace) -----
@pytest.mark.slow
def test_sigkill_of_the_validator_leaves_no_process_under_the_sandbox(bwrap, tmp_path):
    secs = 616
    folder = tmp_path / "hangs-with-survivors"
    folder.mkdir()
    (folder / MANIFEST).write_text('name = "hangs-with-survivors"\nspec = "grpo-token-is"\nentry = "impl:grpo_loss"\n'
                                   'language = "python"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "x"\n')
    (folder / "impl.py").write_text(HANGS_WITH_SURVIVORS.format(secs=secs))
    watch = _Watch(secs)
    proc = subprocess.Popen([sys.executable, "-m", "grpo_conform", "check", str(folder), "--device", "cpu",
                             "--workload", "odd-vocab", "--no-evidence", "--sandbox", "bwrap"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(watch.seen) < 2:
            time.sleep(0.2)
        assert len(watch.seen) >= 2, "the implementation never started its survivors"
        proc.kill()  # no handler, no cleanup in the validator
        proc.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(_gone(p) for p in watch.seen):
            time.sleep(0.1)
        watch.close()
        left = [p for p in watch.seen if not _gone(p)]
        assert not left, [(p, _cmdline(p)) for p in left]
    finally:
        watch.close()
        if proc.poll() is None:
            proc.kill()
        for p in watch.seen:  # never leave a sleeper behind, whatever happened
            if not _gone(p) and watch.match(p):
                os.kill(p, 9)
        import shutil
        import tempfile

        for base in {Path(tempfile.gettempdir()), Path("/tmp")}:  # the scratch tree no cleanup removed
            for copy in base.glob("tmp*/src/impl.py"):
                if f"time.sleep({secs})" in copy.read_text(errors="replace"):
                    shutil.rmtree(copy.parent.parent, ignore_errors=True)
