"""Issue 28, item 1: nothing the code under test creates survives the run.

The review's case: a worker that creates a 16 MiB SysV shared-memory segment and a file in /var/tmp
at import, and is otherwise honest, left both behind after a CONFORMANT check. Here the worker
creates, at import, one of everything it can leave: SysV shared memory, a semaphore set and a
message queue, POSIX shared memory (/dev/shm), a file and a listening unix socket in every
world-writable place and in its HOME; an import that cannot create one of them raises (a load
error), so a CONFORMANT verdict means all of them existed. After the check none is left: with the
worker's own IPC namespace and private tmpfs (the default as root), and with the namespaces
refused (the fallback sweep of the worker's uid, namespaces.clean_up).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from conftest import ROOT
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.isolation import launch, leftovers, namespaces, privilege

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0,
                               reason="namespaces and the uid change need a validator running as root")
WORKLOAD = "batch1-seq1"

TRACES = textwrap.dedent('''\
    import importlib, os, socket, sys
    ctypes = importlib.import_module("ct" + "ypes")  # past the tamper-scan tripwire, as a hostile author would
    sys.path.insert(0, os.path.dirname(__file__))
    from eager import grpo_loss  # honest: only the traces are the point

    MARK, KEY = {mark!r}, {key}
    libc = ctypes.CDLL(None, use_errno=True)

    def _ok(what, value):
        if value == -1 or value is None:
            raise OSError(ctypes.get_errno(), "cannot create " + what)
        return value

    shm = _ok("SysV shm", libc.shmget(KEY, 16 << 20, 0o1600))  # IPC_CREAT | 0600, 16 MiB
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(shm, None, 0)
    ctypes.memset(addr, 0x5A, 16 << 20)  # touched: real pages
    _ok("SysV sem", libc.semget(KEY + 1, 1, 0o1600))
    _ok("SysV msg", libc.msgget(KEY + 2, 0o1600))
    fd = os.open("/dev/shm/" + MARK + ".posix", os.O_CREAT | os.O_RDWR, 0o600)  # what shm_open does
    os.ftruncate(fd, 1 << 20)
    SOCKETS = []
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.environ["HOME"]):
        if os.path.isdir(place) and os.access(place, os.W_OK):
            with open(os.path.join(place, MARK + ".file"), "w") as f:
                f.write("left behind")
            os.makedirs(os.path.join(place, MARK + ".dir", "deeper"))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(os.path.join(place, MARK + ".sock"))
            s.listen(1)
            SOCKETS.append(s)
        elif place in ("/tmp", "/var/tmp", "/dev/shm"):
            raise PermissionError(place + " is not writable: the trace test would prove nothing")
''')


def _impl(tmp_path: Path, mark: str, key: int) -> Path:
    folder = tmp_path / "leaves-traces"
    folder.mkdir()
    (folder / "implementation.toml").write_text(textwrap.dedent('''\
        name = "leaves-traces"
        spec = "grpo-token-is"
        entry = "impl:grpo_loss"
        language = "python"
        license = "MIT"
        devices = ["cpu"]
        description = "honest, but leaves something in every place it can write at import"
    '''))
    (folder / "impl.py").write_text(TRACES.format(mark=mark, key=key))
    eager = (ROOT / "implementations" / "pytorch" / "impl.py").read_text()
    (folder / "eager.py").write_text(eager)
    return folder


def _mark() -> tuple[str, int]:
    mark = f"grpo-traces-{os.getpid()}-{time.monotonic_ns()}"
    return mark, (zlib.crc32(mark.encode()) & 0x3FFFFFF0) + 16


def _left(mark: str, key: int, uid: int) -> list[str]:
    out = []
    for kind in leftovers.SYSV:
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            k = int(line.split()[0])
            if k in (key, key + 1, key + 2):
                out.append(f"{kind} key {k}: {line}")
    out += [f"{kind} {i} of uid {uid}" for kind, i in leftovers.sysv_objects(uid)]
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(place):
            out += [str(p) for p in Path(place).iterdir() if p.name.startswith(mark)]
            out += leftovers.owned_files(uid, place)
    return out


def _check(folder: Path):
    report = run_check(CheckRequest((str(folder),), device="cpu", workloads=(WORKLOAD,), timeout=120))
    (impl,) = report.implementations
    assert report.exit_code == 0 and impl.status == "conformant", impl.message
    return impl.worker


@pytest.fixture(scope="module", autouse=True)
def _eager_exists():
    if not (ROOT / "implementations" / "pytorch" / "impl.py").is_file():
        pytest.skip("implementations/pytorch/impl.py moved: the trace implementation imports it")


@ROOT_ONLY
@pytest.mark.slow
def test_nothing_survives_a_conformant_check_in_the_workers_namespaces(tmp_path):
    mark, key = _mark()
    worker = _check(_impl(tmp_path, mark, key))
    block = worker["isolation"]
    assert block["ipc_namespace"] is True and block["mount_namespace"] is True, block
    assert {"/tmp", "/var/tmp", "/dev/shm"} <= set(block["private"]) and block["not_private"] == [], block
    assert "removed" not in block  # nothing reached the host: nothing to sweep
    assert worker["user"]["uid"] not in (0, privilege.NOBODY)
    assert _left(mark, key, worker["user"]["uid"]) == []


@ROOT_ONLY
@pytest.mark.slow
def test_where_the_namespaces_are_refused_the_sweep_removes_everything(tmp_path, monkeypatch):
    """As on a kernel that refuses unshare: no IPC namespace, no private places. The traces reach the
    host's /tmp, /var/tmp, /dev/shm and SysV tables; the sweep of the worker's uid removes them all."""
    monkeypatch.setattr(namespaces, "wanted", lambda device, sandboxed: {"ipc": False, "mounts": False, "proc": False})
    mark, key = _mark()
    worker = _check(_impl(tmp_path, mark, key))
    block = worker["isolation"]
    assert block["ipc_namespace"] is False and block["private"] == [], block
    assert "removed" in block["fallback"] or "is removed" in block["fallback"], block
    removed = block["removed"]
    assert len(removed["sysv"]) == 3, removed  # shm, sem, msg: they did reach the host
    assert any(p.startswith("/var/tmp/" + mark) for p in removed["files"]), removed
    assert any(p.startswith("/dev/shm/" + mark) for p in removed["files"]), removed
    assert "not_removed" not in removed, removed
    assert _left(mark, key, worker["user"]["uid"]) == []


def test_the_sweep_leaves_older_files_of_the_uid_and_other_uids_alone(tmp_path):
    uid = 589000
    mine, old, other = tmp_path / "mine", tmp_path / "old", tmp_path / "other"
    for p in (mine, old, other):
        p.write_text("x")
    os.chown(old, uid, uid) if os.getuid() == 0 else None
    time.sleep(1.1)  # file times come from a coarse clock: the session sweeps from its start minus 1 s
    started = time.time() - 1.0
    if os.getuid() == 0:
        os.chown(mine, uid, uid)
        (tmp_path / "sub").mkdir()
        os.chown(tmp_path / "sub", uid, uid)
    found = leftovers.owned_files(uid, str(tmp_path), since=started)
    if os.getuid() == 0:
        assert found == sorted([str(mine), str(tmp_path / "sub")])
        result = leftovers.sweep(uid, [str(tmp_path)], sysv=False, since=started)
        assert sorted(result["files"]) == found and not mine.exists() and old.exists() and other.exists()
    else:
        assert found == []


def test_a_refused_namespace_is_reported_with_the_capability_it_needs(tmp_path):
    """The launcher's own code, run without CAP_SYS_ADMIN: it says what was refused and goes on."""
    code = textwrap.dedent(f"""\
        import json, os
        from grpo_conform.isolation import launch  # imported first: the stdlib may lie under a 0700 /root
        if os.getuid() == 0:  # another uid: the kernel clears the effective capabilities
            os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
        facts = {{}}
        launch.enter_ipc_namespace(facts)
        launch.apply_mounts([], {str(tmp_path)!r}, [{{"cover": "/var/tmp", "expose": []}}], facts)
        print(json.dumps(facts))
    """)
    tmp_path.chmod(0o777)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    import json

    facts = json.loads(done.stdout)
    for ns, flag in (("ipc_namespace", "CLONE_NEWIPC"), ("mount_namespace", "CLONE_NEWNS")):
        assert facts[ns].startswith(f"refused: unshare({flag}): Operation not permitted (needs CAP_SYS_ADMIN"), facts
    assert "private" not in facts


def test_the_private_places_cover_every_world_writable_one(tmp_path):
    places = privilege.writable_places("cpu")
    assert "/tmp" in places and all(os.stat(p).st_mode & 0o002 for p in places)
    covers = [m["cover"] for m in privilege.private_scratch_mounts(Path("/tmp/tmpabc"), "cpu")]
    assert covers == places
    assert "/dev/shm" not in privilege.writable_places("cuda")  # torch's CUDA IPC counters live there
    sandboxed = [m["cover"] for m in privilege.private_scratch_mounts(Path("/tmp/tmpabc"), "cpu", sandboxed=True)]
    assert "/var/tmp" not in sandboxed  # read-only under bwrap: it stays so
    assert launch.CLONE_NEWIPC == 0x08000000


def test_the_launchers_report_is_read_up_to_its_newline():
    """Under bwrap the sandbox keeps an inherited copy of the pipe open: no EOF until it exits."""
    r, w = os.pipe()
    kept = os.dup(w)  # as bwrap's monitor would
    os.write(w, b'{"ipc_namespace": true}\n')
    os.close(w)
    started = time.monotonic()
    assert namespaces.read_report(r, timeout=20) == {"ipc_namespace": True}
    assert time.monotonic() - started < 5
    os.close(kept)
    r, w = os.pipe()
    os.close(w)  # the launcher died before writing
    assert namespaces.read_report(r) == {}
