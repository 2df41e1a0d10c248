"""Issue 11: what an implementation running in the worker can do to the validator, measured.

Each test runs hostile code in a real worker and asserts the attack fails: the parent's memory,
ptrace and signals are out of reach, no process or file outlives a check (setsid, double fork,
SIGTERM or SIGINT to the validator), the shared memory cannot be shrunk under the parent, stale
bytecode never runs, a forged message is a failed `runs` check, and `requires` runs nothing of
the folder in the parent. The gallery folders of the same classes: docs/checks.md.
"""

from __future__ import annotations

import json
import os
import re
import py_compile
import signal
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, process_gone
from worker_steps import call_once
from grpo_conform.implementations import MANIFEST, ManifestError, load_implementation
from grpo_conform.isolation import messages
from grpo_conform.isolation.session import WorkerFailure, WorkerSession

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="the user change needs a validator running as root")
SIG = "def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):\n"
MANIFEST_TEXT = """\
name = "{name}"
spec = "grpo-token-is"
entry = "impl:grpo_loss"
language = "python"
license = "MIT"
devices = ["cpu"]
description = "isolation attack"
{extra}"""


def _impl(tmp_path: Path, name: str, source: str, extra: str = "", files: dict[str, bytes] | None = None):
    folder = tmp_path / name
    folder.mkdir()
    (folder / MANIFEST).write_text(MANIFEST_TEXT.format(name=name, extra=extra))
    (folder / "impl.py").write_text(source)
    for rel, data in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return load_implementation(folder)


def _session(impl, timeout: float = 120.0) -> WorkerSession:
    return WorkerSession(impl, {"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0}, torch.device("cpu"),
                         timeout)


def _bind(session: WorkerSession) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"logits": torch.randn(1, 2, 11, generator=g).to(torch.bfloat16),
               "completion_ids": torch.tensor([[3]]), "advantages": torch.tensor([0.5])}
    descriptors = {}
    for name, t in tensors.items():
        _, descriptors[name] = session.allocator.share(t)
    session.bind("in", descriptors)


def _report(session: WorkerSession) -> dict:
    """One call of an implementation that reports what it observed by raising ValueError(json)."""
    _bind(session)
    with pytest.raises(WorkerFailure) as info:
        call_once(session)
    assert info.value.kind == "exception", str(info.value)
    return json.loads(info.value.error["message"])


_gone = process_gone


REACH_PARENT = SIG + textwrap.indent(textwrap.dedent("""\
    import ctypes, json, os, signal
    ppid, out = os.getppid(), {}
    for mode in ("rb", "r+b"):
        try:
            open(f"/proc/{ppid}/mem", mode)
            out["mem_" + mode] = "opened"
        except OSError as exc:
            out["mem_" + mode] = exc.errno
    libc = ctypes.CDLL(None, use_errno=True)
    out["ptrace_attach"] = [libc.ptrace(16, ppid, 0, 0), ctypes.get_errno()]  # PTRACE_ATTACH
    out["ptrace_seize"] = [libc.ptrace(0x4206, ppid, 0, 0), ctypes.get_errno()]  # PTRACE_SEIZE
    for name, sig in (("probe", 0), ("stop", signal.SIGSTOP)):
        try:
            os.kill(ppid, sig)
            out["kill_" + name] = "delivered"
        except OSError as exc:
            out["kill_" + name] = exc.errno
    try:
        open(PACKAGE + "/__init__.py", "a").close()
        out["write_package"] = "opened"
    except OSError as exc:
        out["write_package"] = exc.errno
    out["uid"], out["cwd"] = os.getuid(), os.getcwd()
    out["status"] = [l for l in open("/proc/self/status").read().splitlines() if l.startswith(("NoNewPrivs", "CapEff"))]
    out["cmdline"] = open("/proc/self/cmdline", "rb").read().decode(errors="replace")
    out["environ"] = sorted(os.environ)
    raise ValueError(json.dumps(out))
"""), "    ")


def test_the_worker_cannot_reach_the_parent(tmp_path):
    import grpo_conform

    package = str(Path(grpo_conform.__file__).resolve().parent)
    impl = _impl(tmp_path, "reach-parent", f"PACKAGE = {package!r}\n" + REACH_PARENT)
    with _session(impl) as session:
        info = session.info
        out = _report(session)
    assert out["mem_rb"] != "opened" and out["mem_r+b"] != "opened"  # parent non-dumpable
    assert out["ptrace_attach"][0] == -1 and out["ptrace_seize"][0] == -1
    assert "NoNewPrivs:\t1" in out["status"]
    # neutral: an argv like any multiprocessing spawn child, no MALLOC_*, no grpo-conform directory
    assert "grpo" not in out["cmdline"] and "--multiprocessing-fork" in out["cmdline"]
    assert not any(k.startswith(("MALLOC_", "GRPO")) for k in out["environ"])
    assert "grpo" not in out["cwd"] and not out["cwd"].startswith("/dev/shm")
    if os.getuid() == 0:
        assert out["uid"] != 0 and info["privileges"]["capabilities"] == "none"
        assert info["privileges"]["no_new_privs"] is True and info["privileges"]["uid"][0] == out["uid"]
        assert out["kill_probe"] == out["kill_stop"] == 1  # EPERM: no signal reaches the parent
        assert out["write_package"] == 13  # EACCES: the validator's code cannot be rewritten


SURVIVORS = SIG + textwrap.indent(textwrap.dedent("""\
    import os, subprocess, sys, time
    # a setsid child, a double-forked setsid grandchild, and files in /tmp and /dev/shm
    a = subprocess.Popen(["sleep", str(SECS)], start_new_session=True)
    # each line in one write(2) (atomic on a pipe): print's separate writes of words, spaces and newline
    # interleaved with the other process's ("grandchildchild 2191\\n 2193", CI 2026-12-03)
    code = "import os, sys, time\\nif os.fork() == 0:\\n    os.setsid()\\n    " \\
           "os.write(2, ('grandchild %d\\\\n' % os.getpid()).encode())\\n" \\
           f"    time.sleep({SECS})\\nos._exit(0)\\n"
    subprocess.run([sys.executable, "-c", code])
    os.write(2, f"child {a.pid}\\n".encode())
    for d in ("/tmp", "/dev/shm"):
        open(os.path.join(d, MARK), "w").write("left behind")
    time.sleep(2)
    return (logits.float() * 0).sum()
"""), "    ")


@pytest.mark.slow
def test_no_descendant_survives_setsid_or_a_double_fork(tmp_path):
    mark = f"grpo-survivor-{os.getpid()}-{time.monotonic_ns()}"
    impl = _impl(tmp_path, "survivors", f"MARK = {mark!r}\nSECS = 611\n" + SURVIVORS)
    session = _session(impl)
    try:
        session.start()
        _bind(session)
        call_once(session)
        # two processes write to one stderr: a print's text and its newline may be separate writes, so
        # another line can land between them ("grandchild 27429child 27431"): match the words, not lines.
        # The grandchild prints after its parent exited, so its line can reach the tail after the call returns.
        found, deadline = {}, time.monotonic() + 15
        while len(found) < 2 and time.monotonic() < deadline:
            tail = session.stderr_tail()
            found = {w: m for w in ("child", "grandchild") if (m := re.search(rf"(?<!grand){w} (\d+)", tail))}
            time.sleep(0.1 if len(found) < 2 else 0)
        assert len(found) == 2, f"the survivors never reported their pids: {tail[-2000:]!r}"
        pids = [int(found[w].group(1)) for w in ("child", "grandchild")]
        assert not any(_gone(p) for p in pids), "the test did not start its survivors"
    finally:
        session.close()
    assert all(_gone(p) for p in pids), "a process the implementation started outlived its check"
    if os.getuid() == 0:  # the worker's /tmp and /dev/shm were private to its mount namespace
        assert not (Path("/tmp") / mark).exists() and not (Path("/dev/shm") / mark).exists()


def _descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_validator_leaves_no_process_and_no_file(tmp_path, sig, code, said):
    """`python -m grpo_conform check` (the CI gate's process) gets SIGTERM or SIGINT while a call is under way
    in which the implementation started a setsid child and a double-forked grandchild and wrote files in
    /tmp and /dev/shm: it exits 143 or 130 with its message and no traceback, and leaves no process, no
    scratch tree under TMPDIR, no marked file and no half-written evidence or JUnit file. (One test for
    what were two processes each: test_gate_e2e's interrupt test, merged here with its assertions;
    docs/timing.md, "Eighth pass".)"""
    mark = f"grpo-signal-{os.getpid()}-{time.monotonic_ns()}"
    secs = 612 if sig == signal.SIGTERM else 613
    source = f"MARK = {mark!r}\nSECS = {secs}\n" + SURVIVORS.replace("time.sleep(2)", "time.sleep(600)")
    impl = _impl(tmp_path, "interrupted", source)
    # Every temporary file of the run (worker scratch trees, slot files) goes under TMPDIR: a folder of this
    # test's own, traversable by the unprivileged worker user like /tmp itself.
    scratch = Path(tempfile.mkdtemp(prefix="gate-signal-", dir="/tmp"))
    scratch.chmod(0o711)
    proc = subprocess.Popen([sys.executable, "-m", "grpo_conform", "check", str(impl.path), "--device", "cpu",
                             "--workload", "odd-vocab", "--timeout", "300", "--evidence-dir", str(tmp_path / "ev"),
                             "--junit-xml", str(tmp_path / "j.xml")],
                            cwd=ROOT, env=dict(os.environ, TMPDIR=str(scratch)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:  # progress lines: stderr is not a terminal here
            if ": conformance" in line:
                break
        else:
            pytest.fail("no progress line before the end")
        deadline = time.monotonic() + 240
        sleepers: list[int] = []
        while time.monotonic() < deadline and len(sleepers) < 2:
            time.sleep(0.5)
            sleepers = [int(p) for p in os.listdir("/proc") if p.isdigit()
                        and (_cmdline(int(p)) == f"sleep\x00{secs}\x00" or f"time.sleep({secs})" in _cmdline(int(p)))]
        assert sleepers, "the implementation never started"
        time.sleep(1)  # the call is under way (and never returns)
        workers = _descendants(proc.pid)
        assert workers, "no worker process"
        assert list(scratch.iterdir()), "the worker's scratch tree is not under TMPDIR"
        proc.send_signal(sig)
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == code, rest[-2000:]  # never killed by a signal
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        assert said in rest and "Traceback" not in rest, rest[-2000:]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(_gone(p) for p in sleepers):
            time.sleep(0.2)
        assert all(_gone(p) for p in sleepers), "a process survived the validator's interrupt"
        assert not [w for w in workers if not _gone(w)], "a worker process outlived the run"
        assert not list(scratch.iterdir()), f"left behind: {list(scratch.iterdir())}"
        assert not [d for d in Path("/tmp").glob("tmp*/src/impl.py") if mark in d.read_text(errors="replace")]
        if os.getuid() == 0:
            assert not (Path("/tmp") / mark).exists() and not (Path("/dev/shm") / mark).exists()
        assert not (tmp_path / "ev").exists() and not (tmp_path / "j.xml").exists()  # nothing half-written
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


TRUNCATES = textwrap.dedent("""\
    import json, os, stat
    kept, close = [], os.close

    def grab(fd):  # installed at import, before any bind: every memfd the worker receives is kept
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                kept.append(os.dup(fd))
        finally:
            close(fd)

    os.close = grab
""") + SIG + textwrap.indent(textwrap.dedent("""\
    tried = []
    for fd in kept:
        try:
            os.ftruncate(fd, 0)
            tried.append("truncated")
        except OSError as exc:
            tried.append(exc.errno)
    raise ValueError(json.dumps(tried))
"""), "    ")


def test_truncating_the_shared_memory_is_refused_and_the_parent_lives(tmp_path):
    impl = _impl(tmp_path, "truncates", TRUNCATES)
    with _session(impl) as session:
        g = torch.Generator().manual_seed(0)
        shared = {}
        descriptors = {}
        for name, t in {"logits": torch.randn(1, 2, 11, generator=g).to(torch.bfloat16),
                        "completion_ids": torch.tensor([[3]]), "advantages": torch.tensor([0.5])}.items():
            shared[name], descriptors[name] = session.allocator.share(t)
        session.bind("in", descriptors)
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
        tried = json.loads(info.value.error["message"])
        assert len(tried) == 3, tried  # the worker held every input's memfd
        assert all(v == 1 for v in tried), tried  # EPERM: sealed against shrinking
        assert session.alive
        assert float(shared["advantages"][0]) == 0.5 and shared["logits"].float().abs().sum() > 0  # no SIGBUS


def test_stale_bytecode_never_runs(tmp_path):
    """A reviewer reads impl.py; an unchecked-hash .pyc beside it in __pycache__ says otherwise."""
    honest = SIG + "    raise ValueError('the source ran')\n"
    cheat = SIG + "    raise ValueError('the bytecode ran')\n"
    folder = tmp_path / "stale-bytecode"
    folder.mkdir()
    (folder / MANIFEST).write_text(MANIFEST_TEXT.format(name="stale-bytecode", extra=""))
    (folder / "impl.py").write_text(cheat)
    py_compile.compile(str(folder / "impl.py"), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                       doraise=True)
    (folder / "impl.py").write_text(honest)  # the .pyc stays: unchecked-hash bytecode is never revalidated
    assert list((folder / "__pycache__").glob("impl.*.pyc"))
    impl = load_implementation(folder)
    with _session(impl) as session:
        _bind(session)
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
    assert "the source ran" in str(info.value)


@pytest.mark.parametrize("name,data,problem", [
    ("__pycache__/kernel.so", b"\x7fELF", "__pycache__ may hold only bytecode"),
    ("impl_helper.pyc", b"\x00" * 16, "bytecode outside __pycache__"),
])
def test_files_the_identity_does_not_cover_are_refused(tmp_path, name, data, problem):
    with pytest.raises(ManifestError, match=problem):
        _impl(tmp_path, "undeclared", SIG + "    return logits.sum()\n", files={name: data})


def test_requires_runs_nothing_of_the_folder_in_the_parent(tmp_path, monkeypatch):
    marker = tmp_path / "imported-in-parent"
    package = tmp_path / "pkgroot"
    package.mkdir()
    monkeypatch.syspath_prepend(str(package))
    (package / "evilreq").mkdir()
    (package / "evilreq" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    impl = _impl(tmp_path, "requires-top", SIG + "    return logits.sum()\n", extra='requires = ["evilreq"]\n')
    assert impl.missing_requirements() == [] and not marker.exists()  # found, never run
    with pytest.raises(ManifestError, match="top-level module name"):
        _impl(tmp_path, "requires-dotted", SIG + "    return logits.sum()\n", extra='requires = ["evilreq.sub"]\n')
    assert not marker.exists()
    # the implementation folder cannot satisfy its own requirement (the worker would import it from there)
    inside = _impl(tmp_path, "requires-itself", SIG + "    return logits.sum()\n", extra='requires = ["helperpkg"]\n',
                   files={"helperpkg/__init__.py": b""})
    monkeypatch.syspath_prepend(str(inside.path))
    assert inside.missing_requirements() == ["helperpkg"]


FORGES = SIG + textwrap.indent(textwrap.dedent("""\
    import gc, json
    from multiprocessing.connection import Connection
    gc.unfreeze()  # the worker froze its own objects before the import (worker.op_load): thaw them to find its pipe
    conn = next(o for o in gc.get_objects() if isinstance(o, Connection))
    # a forged reply to the parent's forward whose loss description has the wrong types
    conn.send_bytes(json.dumps({"status": "ok", "loss": {"type": 5, "exact_tensor": "yes"}}).encode())
    return (logits.float() * 0).sum()
"""), "    ")


def test_a_forged_message_is_a_protocol_failure(tmp_path):
    impl = _impl(tmp_path, "forges", FORGES)
    with _session(impl) as session:
        _bind(session)
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
        assert info.value.kind == "protocol"
        assert "malformed at loss.type" in str(info.value)
        assert not session.alive  # the stream is not trusted any more


@pytest.mark.parametrize("op,msg,where", [
    ("load", {"status": "ok", "info": {"torch": "2", "pid": "12"}}, "info.pid"),
    ("load", {"status": "ok", "info": {"torch": "2", "pid": 12, "extra": 1}}, "info.extra"),
    ("export", {"status": "ok", "report": {"loss": None, "grads": {}, "storage": {"loss": [1, 2, 3]}}},
     "report.storage.loss"),
    ("export", {"status": "ok", "report": {"loss": None, "grads": {}, "storage": {"loss": [-5, 2]}}},
     "report.storage.loss.0"),
    ("export", {"status": "ok", "report": {"loss": None, "grad": None, "storage": {}}}, "report.grads"),
    ("export", {"status": "ok", "report": {"loss": None, "grads": {"logits": {"type": "torch.Tensor",
                "exact_tensor": "yes"}}, "storage": {}}}, "report.grads.logits.exact_tensor"),
    ("time", {"status": "ok", "results": [{"event_ns": True, "wall_ns": 1, "pre_ns": 1, "enqueue_ns": 1,
                                           "peak_bytes": 0}]}, "results.0.event_ns"),
    ("bind", {"status": "ok", "sneaky": 1}, "sneaky"),
    ("bind", {"status": "error", "error": {"type": "X", "message": "m" * 5000}}, "error.message"),
])
def test_strict_reply_models(op, msg, where):
    with pytest.raises(messages.MalformedReply, match=f"malformed at {where}"):
        messages.parse_reply(op, msg)


def test_reply_models_accept_what_the_worker_sends():
    _, ok = messages.parse_reply("export", {"status": "ok", "report": {
        "loss": {"type": "torch.Tensor", "exact_tensor": True, "dtype": "float32", "shape": [], "device": "cpu",
                 "layout": "strided", "requires_grad": True, "has_grad_fn": True},
        "grads": {"logits": None}, "storage": {"loss": [140000000, 4], "grad:logits": None}}})
    assert "dtype" in ok["report"]["loss"] and ok["report"]["grads"] == {"logits": None}
    _, other = messages.parse_reply("forward", {"status": "ok", "loss": {"type": "builtins.float", "exact_tensor": False}})
    assert other["loss"] == {"type": "builtins.float", "exact_tensor": False}  # no invented fields
    with pytest.raises(messages.MalformedReply, match="no reply model"):
        messages.parse_reply("unheard-of", {"status": "ok"})


def test_a_directory_the_worker_user_cannot_enter_is_found():
    import shutil
    import tempfile

    from grpo_conform.isolation.privilege import WorkerIdentity, blocked_ancestor

    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o755)
        hidden = base / "home"
        (hidden / "python" / "lib").mkdir(parents=True)
        hidden.chmod(0o700)
        nobody = WorkerIdentity(65534, 65534, "nobody")
        assert blocked_ancestor(hidden / "python" / "lib", nobody) == hidden
        assert blocked_ancestor(base / "x", nobody) is None
        owner = WorkerIdentity(os.stat(hidden).st_uid, os.stat(hidden).st_gid, "owner")
        assert blocked_ancestor(hidden / "python", owner) is None
    finally:
        shutil.rmtree(base)


@ROOT_ONLY
def test_the_worker_sees_none_of_a_hidden_home_but_the_interpreter(tmp_path):
    source = SIG + "    import json, os\n    raise ValueError(json.dumps(sorted(os.listdir('/root'))))\n"
    impl = _impl(tmp_path, "lists-root", source)
    with _session(impl) as session:
        seen = _report(session)
    from grpo_conform.isolation.privilege import mount_plan, worker_identity

    plan = {m["cover"]: m["expose"] for m in mount_plan(worker_identity())}
    if "/root" in plan:  # this machine's Python lives under a 0700 /root
        assert seen == sorted(os.path.basename(e) for e in plan["/root"])
    else:
        assert seen == [] or not os.access("/root", os.R_OK)
