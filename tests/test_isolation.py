"""The worker process: a clean environment (no secrets), hangs and crashes turned into typed
failures with the tail of the worker's stderr, and CPU tensors shared through sealed memfds
(views of larger buffers included). Attacks on the parent: tests/test_isolation_attacks.py."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from worker_steps import call_once
from grpo_conform.check import CheckRequest, run_check
from grpo_conform.implementations import MANIFEST, load_implementation
from grpo_conform.isolation import session as session_module
from grpo_conform.isolation.session import LOAD_TIMEOUT_MIN, WorkerFailure, WorkerSession, worker_environment
from grpo_conform.isolation.sharing import VIEW_OFFSET, SharedAllocator, open_descriptor

SECRETS = {
    "GRPO_CONFORM_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----",
    "GRPO_CONFORM_SIGNING_KEY_FILE": "/nonexistent/key.pem",
    "FOO_TOKEN": "tok-71c1e0",
    "AWS_SECRET_ACCESS_KEY": "aws-7f3a9d",
    "ANY_SEED": "1234567",
    # Names the allow-list would let through, dropped for looking like secrets:
    "TORCH_MANUAL_SEED": "seed-99-e4c1",  # distinctive: a bare "99" turns up inside drawn uids and paths
    "TRITON_AUTH_TOKEN": "triton-tok",
    "CUDA_API_KEY": "cuda-key",
    "TORCH_PASSWORD": "hunter2",
    "NCCL_CREDENTIALS": "creds",
}
KEPT = {"TRITON_CACHE_DIR": "/tmp/triton-cache-test", "TORCH_HOME": "/tmp/torch-home-test", "OMP_NUM_THREADS": "1"}

MANIFEST_TEXT = """\
name = "{name}"
spec = "grpo-token-is"
entry = "impl:grpo_loss"
language = "python"
license = "MIT"
devices = ["cpu"]
description = "isolation test implementation"
"""


def _impl(tmp_path: Path, name: str, source: str, extra: dict[str, str] | None = None):
    folder = tmp_path / name
    folder.mkdir()
    (folder / MANIFEST).write_text(MANIFEST_TEXT.format(name=name))
    (folder / "impl.py").write_text(source)
    for rel, text in (extra or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return load_implementation(folder)


def _worker_report(session: WorkerSession) -> dict:
    """Run one call of an implementation that reports what it saw by raising ValueError(json)."""
    _bind_small_inputs(session)
    with pytest.raises(WorkerFailure) as info:
        call_once(session)
    assert info.value.kind == "exception", str(info.value)
    return json.loads(info.value.error["message"])


def _session(impl, timeout: float = 120.0) -> WorkerSession:
    return WorkerSession(impl, {"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0},
                         torch.device("cpu"), timeout)


def _bind_small_inputs(session: WorkerSession) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"logits": torch.randn(1, 2, 11, generator=g).to(torch.bfloat16),
               "completion_ids": torch.tensor([[3]]), "advantages": torch.tensor([0.5])}
    descriptors = {}
    for name, t in tensors.items():
        _, descriptors[name] = session.allocator.share(t)
    session.bind("in", descriptors)


# -- the environment -----------------------------------------------------------------------------------
def test_worker_environment_drops_secrets_and_keeps_the_toolchain(monkeypatch):
    for k, v in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GRPO_CONFORM_SPECS", "/somewhere")
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    env = worker_environment("cpu", interpret=False)
    for k in SECRETS:
        assert k not in env, k
    assert "GRPO_CONFORM_SPECS" not in env and "UNRELATED_VARIABLE" not in env
    assert not any(k.startswith("GRPO_CONFORM") for k in env)
    for k, v in KEPT.items():
        assert env[k] == v
    assert env["PATH"] == os.environ["PATH"]
    assert "TRITON_INTERPRET" not in env
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert not any(v in env.values() for v in SECRETS.values())


def test_worker_environment_interpreter_and_no_allocator_variables(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert worker_environment("cpu", interpret=True)["TRITON_INTERPRET"] == "1"
    assert worker_environment("cpu", interpret=False)["TRITON_INTERPRET"] == "0"  # passed through as is
    for device in ("cpu", "cuda"):  # mallopt in the worker instead: nothing to recognise the validator by
        assert not any(k.startswith("MALLOC_") for k in worker_environment(device, interpret=False))


def test_a_dropped_worker_gets_a_private_home_and_caches(monkeypatch, tmp_path):
    for k, v in KEPT.items():
        monkeypatch.setenv(k, v)
    env = worker_environment("cpu", interpret=False, home=tmp_path, user="nobody")
    assert env["HOME"] == str(tmp_path) and env["USER"] == env["LOGNAME"] == "nobody"
    for key in ("TRITON_CACHE_DIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "TMPDIR"):
        assert Path(env[key]).parent == tmp_path, key  # never a cache another implementation shares
    assert env["OMP_NUM_THREADS"] == "1"


def test_a_worker_that_keeps_the_validator_s_user_still_gets_private_caches(monkeypatch, tmp_path):
    """On CUDA the worker keeps the validator's user (only it can open the parent's buffers): its HOME is
    the validator's, but no cache is one another implementation's worker wrote (the H200 runs: /root/.triton
    was every implementation's before)."""
    monkeypatch.setenv("HOME", "/home/validator")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/home/validator/.triton")
    env = worker_environment("cuda", interpret=False, caches=tmp_path)
    assert env["HOME"] == "/home/validator"
    for key in ("TRITON_CACHE_DIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "TMPDIR"):
        assert Path(env[key]).parent == tmp_path, key


@pytest.mark.slow
def test_the_worker_process_sees_no_secret(tmp_path, monkeypatch):
    for k, v in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(k, v)
    source = (
        "import json, os, pathlib\n"
        "names = json.loads((pathlib.Path(__file__).parent / 'secrets.json').read_text())\n"
        "def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):\n"
        "    seen = dict(os.environ)\n"
        "    report = {'leaked': sorted(set(seen) & set(names)), 'values': [v for v in names.values() if v in json.dumps(seen)],\n"
        "              'kept': {k: seen.get(k) for k in %r}, 'path': 'PATH' in seen, 'home': seen.get('HOME')}\n"
        "    raise ValueError(json.dumps(report))\n" % (sorted(KEPT),)
    )
    impl = _impl(tmp_path, "env-dump", source, extra={"secrets.json": json.dumps(SECRETS)})
    assert os.environ["GRPO_CONFORM_SIGNING_KEY"] == SECRETS["GRPO_CONFORM_SIGNING_KEY"]
    with _session(impl) as session:
        assert session.info["pid"] != os.getpid()
        report = _worker_report(session)
    assert not report["leaked"], f"the worker saw {report['leaked']}"
    assert not report["values"]
    assert report["path"] and report["kept"]["OMP_NUM_THREADS"] == "1"
    if os.getuid() == 0:  # dropped: caches in the private home, never the validator's
        assert report["kept"]["TRITON_CACHE_DIR"].startswith(report["home"])
    else:
        assert report["kept"] == KEPT


# -- hangs and crashes ---------------------------------------------------------------------------------
HANG = """\
import os, pathlib, subprocess, sys, time
def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    child = subprocess.Popen(["sleep", "600"])
    print("child", child.pid, file=sys.stderr, flush=True)
    print("hanging now", file=sys.stderr, flush=True)
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie waits for a reaper that may not exist in a container


@pytest.mark.slow
def test_a_hang_ends_within_the_timeout_and_kills_the_process_group(tmp_path):
    impl = _impl(tmp_path, "hangs", HANG)
    session = _session(impl)
    try:
        session.start()
        _bind_small_inputs(session)
        session.timeout = 3.0
        pid = session.proc.pid
        started = time.monotonic()
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
        elapsed = time.monotonic() - started
        assert info.value.kind == "timeout"
        assert str(info.value) == "no answer within 3 s: process killed"
        assert 3.0 <= elapsed < 3.0 + 5.0
        assert "hanging now" in info.value.stderr_tail
        assert info.value.evidence()["kind"] == "timeout"
        assert not session.alive and _gone(pid)
        child = int(info.value.stderr_tail.split("child ")[1].split()[0])
        deadline = time.monotonic() + 5
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(child), "a process the implementation started outlived the timeout"
    finally:
        session.close()


@pytest.mark.slow
def test_a_hang_at_import_times_out_the_load(tmp_path, monkeypatch):
    # The load's least time (LOAD_TIMEOUT_MIN, 30 s: torch's import on a loaded machine) made short
    # for the test, still above the call timeout: the message must name the least time, not the
    # call's timeout, and the hang must cost that time once. 3 s (6 s until 2026-12-03): three times
    # the call timeout, and the implementation never returns from its import whatever the least time.
    least = 3.0
    assert LOAD_TIMEOUT_MIN > least
    monkeypatch.setattr(session_module, "LOAD_TIMEOUT_MIN", least)
    impl = _impl(tmp_path, "hangs-at-import", "import time\ntime.sleep(600)\n")
    session = _session(impl, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        session.start()
    session.close()
    assert info.value.kind == "timeout" and least <= time.monotonic() - started < least + 10.0
    assert str(info.value) == f"no answer within {least:g} s: process killed"  # the load's least time


CRASHES = {
    "exit-9": ("os._exit(9)", "the implementation's process exited with status 9"),
    "sigkill": ("os.kill(os.getpid(), signal.SIGKILL)", "the implementation's process killed by signal SIGKILL"),
    "sigsegv": ("os.kill(os.getpid(), signal.SIGSEGV)", "the implementation's process killed by signal SIGSEGV"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CRASHES), ids=list(CRASHES))
def test_a_crash_is_reported_with_its_status_and_the_stderr_tail(tmp_path, case):
    how, message = CRASHES[case]
    source = (
        "import os, signal, sys\n"
        "def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):\n"
        "    print('last words of the kernel: 0xDEAD', file=sys.stderr, flush=True)\n"
        f"    {how}\n"
    )
    impl = _impl(tmp_path, case, source)
    with _session(impl) as session:
        _bind_small_inputs(session)
        started = time.monotonic()
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
        assert time.monotonic() - started < 30  # noticed at once, not at the timeout
        assert info.value.kind == "crash"
        assert str(info.value) == message
        assert "last words of the kernel: 0xDEAD" in info.value.stderr_tail
        assert info.value.evidence()["stderr_tail"] == info.value.stderr_tail
        assert not session.alive


@pytest.mark.slow
def test_an_exception_in_the_call_is_not_a_crash(tmp_path):
    source = (
        "def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):\n"
        "    raise ValueError('unsupported vocab ' + str(logits.shape[-1]))\n"
    )
    impl = _impl(tmp_path, "raises", source)
    with _session(impl) as session:
        _bind_small_inputs(session)
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
        assert info.value.kind == "exception"
        assert str(info.value) == "forward raised ValueError: unsupported vocab 11 at impl.py:2"
        assert info.value.error["where"] == "impl.py:2"
        assert session.alive  # the worker keeps serving after an exception


@pytest.mark.slow
def test_a_crash_at_import_is_a_load_error_with_the_stderr_tail(tmp_path):
    source = "import os, sys\nprint('cannot initialise: 0xBEEF', file=sys.stderr, flush=True)\nos._exit(4)\n"
    impl = _impl(tmp_path, "dies-at-import", source)
    report = run_check(CheckRequest((str(impl.path),), device="cpu", workloads=("batch1-seq1",), timeout=60))
    (result,) = report.implementations
    assert report.exit_code == 2 and result.status == "load-error"
    assert result.message.startswith(f"{impl.path / MANIFEST}: field 'entry': loading failed: "
                                     "the implementation's process exited with status 4")
    assert "cannot initialise: 0xBEEF" in result.message


# -- shared CPU tensors --------------------------------------------------------------------------------
def _open(alloc: SharedAllocator, desc: dict):
    """What the worker does with a descriptor and the file descriptors that came with it."""
    desc = json.loads(json.dumps(desc))  # descriptors are JSON
    return open_descriptor(desc, {desc["fd"]: os.dup(alloc._fds[desc["fd"]])} if desc["kind"] == "memfd" else None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64])
def test_shared_cpu_tensors_map_the_same_memory(dtype):
    alloc = SharedAllocator(torch.device("cpu"))
    parent, desc = alloc.empty((3, 5), dtype)
    assert desc["kind"] == "memfd" and desc["view"] == {"storage_offset": 0, "shape": [3, 5], "stride": [5, 1]}
    child = _open(alloc, desc)
    assert child.dtype == dtype and child.shape == (3, 5) and child.data_ptr() != parent.data_ptr()
    parent.fill_(0)
    child[1, 2] = 7
    assert int(parent[1, 2]) == 7 and int(parent.sum()) == 7
    parent[2, 4] = -3
    assert int(child[2, 4]) == -3
    alloc.close()


def test_share_copies_the_values():
    alloc = SharedAllocator(torch.device("cpu"))
    source = torch.randn(4, 6).to(torch.bfloat16)
    shared, desc = alloc.share(source)
    assert torch.equal(shared, source) and shared.data_ptr() != source.data_ptr()
    assert torch.equal(_open(alloc, desc), source)
    _, other = alloc.share(source)
    assert other["fd"] != desc["fd"]  # one memfd per tensor
    empty, edesc = alloc.empty((0, 3), torch.float32)
    assert _open(alloc, edesc).shape == (0, 3) and empty.numel() == 0


@pytest.mark.parametrize("kind", ["offset", "strided"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (5,)])
def test_views_of_a_larger_buffer(kind, shape):
    alloc = SharedAllocator(torch.device("cpu"))
    source = torch.randn(shape)
    parent, desc = alloc.share(source, kind)
    child = _open(alloc, desc)
    assert torch.equal(child, source) and child.stride() == parent.stride() and tuple(desc["view"]["shape"]) == shape
    assert child.storage_offset() == parent.storage_offset() == VIEW_OFFSET
    if kind == "strided":
        assert not child.is_contiguous() and child.stride()[-1] == (2 if len(shape) == 1 else 1)
    else:
        assert child.is_contiguous()
    assert torch.isnan(child.as_strided((VIEW_OFFSET,), (1,), 0)).all()  # the padding reads NaN
    child.add_(1)
    assert torch.equal(parent, source + 1)


def test_a_view_that_does_not_fit_its_buffer_is_refused():
    alloc = SharedAllocator(torch.device("cpu"))
    _, desc = alloc.empty((4,), torch.float32)
    desc["view"] = {"storage_offset": 2, "shape": [4], "stride": [1]}
    with pytest.raises(ValueError, match="does not fit"):
        _open(alloc, desc)


def test_shared_memory_cannot_be_shrunk_or_grown():
    """The worker's attack on the parent's mapping: truncating the memory (SIGBUS in the parent)."""
    alloc = SharedAllocator(torch.device("cpu"))
    parent, desc = alloc.empty((1024,), torch.float32)
    fd = os.dup(alloc._fds[desc["fd"]])
    for size in (0, 4, 1 << 20):
        with pytest.raises(PermissionError):
            os.ftruncate(fd, size)
    with pytest.raises(PermissionError):  # no seal can be added either (F_SEAL_SEAL)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
    parent.fill_(1.0)
    assert float(parent.sum()) == 1024.0
    os.close(fd)


def test_a_write_in_another_process_is_seen():
    alloc = SharedAllocator(torch.device("cpu"))
    tensor, desc = alloc.empty((4,), torch.float32)
    tensor.zero_()
    fd = os.dup(alloc._fds[desc["fd"]])
    script = ("import json, sys\nfrom grpo_conform.isolation.sharing import open_descriptor\n"
              "d = json.loads(sys.argv[1])\nt = open_descriptor(d, {d['fd']: int(sys.argv[2])})\nt[2] = 42.5\n")
    subprocess.run([sys.executable, "-c", script, json.dumps(desc), str(fd)], check=True, cwd=ROOT, timeout=120,
                   pass_fds=(fd,))
    os.close(fd)
    assert tensor.tolist() == [0.0, 0.0, 42.5, 0.0]


def test_unknown_descriptor_kind():
    with pytest.raises(ValueError, match="unknown tensor descriptor kind 'pickle'"):
        open_descriptor({"kind": "pickle"})


def test_the_pre_start_spin_covers_the_host_enqueue_time_within_bounds():
    from grpo_conform.isolation.worker import MAX_SPIN_CYCLES, PRE_SPIN_CYCLES, spin_cycles_for

    assert spin_cycles_for(0) == PRE_SPIN_CYCLES  # never less than 0.2 ms
    assert spin_cycles_for(1_000_000) == 3_000_000  # 1 ms to enqueue: 1.5 ms of spin at 2 cycles per ns
    assert spin_cycles_for(10**12) == MAX_SPIN_CYCLES  # a call that blocks the host gets no endless spin


def test_a_python_or_checkout_under_tmp_stays_visible_behind_the_private_tmp(monkeypatch):
    """The worker's private /tmp hides everything but its scratch tree; an interpreter, a virtual
    environment or the package under /tmp (a CI clone there) must be exposed with it, else every
    worker fails to start ("No such file or directory: '/tmp/.../bin/python3'")."""
    import sys as _sys
    from pathlib import Path as _Path

    from grpo_conform.isolation import privilege

    monkeypatch.setattr(_sys, "prefix", "/tmp/clone/.ci-venv")
    monkeypatch.setattr(_sys, "executable", "/tmp/clone/.ci-venv/bin/python3")
    (cover,) = [m for m in privilege.private_scratch_mounts(_Path("/tmp/grpo-conform-x"), "cuda")
                if m["cover"] == "/tmp"]
    assert cover["expose"][0] == "/tmp/grpo-conform-x" and "/tmp/clone" in cover["expose"]
    monkeypatch.setattr(_sys, "prefix", "/opt/venv")
    monkeypatch.setattr(_sys, "executable", "/opt/venv/bin/python3")
    (cover,) = [m for m in privilege.private_scratch_mounts(_Path("/tmp/grpo-conform-x"), "cuda")
                if m["cover"] == "/tmp"]
    assert all(e == "/tmp/grpo-conform-x" or not e.startswith("/tmp/clone") for e in cover["expose"])
