"""CPU workers forked from the zygote (grpo_conform/isolation/zygote.py) are isolated exactly as
workers the launcher executes: the same parent (the validator), session, user, capabilities,
no_new_privs, namespaces, argv and environment, and an exit status the session reads itself."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from test_isolation import _impl, _session, _worker_report
from grpo_conform.isolation import zygote

REPORT = """\
import json, os, sys
def _fds():
    out = {}
    for f in os.listdir("/proc/self/fd"):
        try:
            out[f] = os.readlink("/proc/self/fd/" + f).split(":")[0]
        except OSError:
            pass
    return out
def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    raise ValueError(json.dumps({"environ": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(),
                                 "fds": _fds(),
                                 "tmp": __import__("tempfile").gettempdir(), "pgid": os.getpgid(0),
                                 "threads": __import__("torch").get_num_threads(),
                                 "seed": __import__("torch").initial_seed()}))
"""


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _run(tmp_path, monkeypatch, switch: str) -> tuple[dict, dict]:
    monkeypatch.setenv(zygote.ENV_SWITCH, switch[0])
    (tmp_path / switch).mkdir()
    impl = _impl(tmp_path / switch, "reports", REPORT)
    session = _session(impl)
    started = time.monotonic()
    with session:
        # a worker that read its parent after the helper had gone waited 30 s for a hand-over it had
        # already had (fixed: the helper's pid is taken before the fork); a start is seconds
        assert time.monotonic() - started < 25
        forked = isinstance(session.proc, zygote.Forked)
        pid = session.proc.pid
        fields = _stat(pid)
        facts = {"forked": forked, "ppid": int(fields[1]), "sid": int(fields[3]), "pid": pid,
                 "cmdline": Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")[1:],
                 "privileges": {k: v for k, v in session.info["privileges"].items()},
                 "isolation": session.info["isolation"]}
        seen = _worker_report(session)
    return facts, seen


def test_a_forked_worker_is_isolated_as_a_launched_one(tmp_path, monkeypatch):
    forked, seen_f = _run(tmp_path, monkeypatch, "1")
    launched, seen_l = _run(tmp_path, monkeypatch, "0")
    assert forked["forked"] and not launched["forked"]  # the zygote is used on the CPU unless switched off
    for facts in (forked, launched):
        assert facts["ppid"] == os.getpid() and facts["sid"] == facts["pid"]  # our child, in a session of its own
        assert facts["cmdline"][-1] == b"--multiprocessing-fork"  # the neutral spawn argv
    differs = {"uid", "gid"}  # a drawn uid per worker
    assert {k: v for k, v in forked["privileges"].items() if k not in differs} == \
        {k: v for k, v in launched["privileges"].items() if k not in differs}
    if os.getuid() == 0:  # root: a drawn uid of its own per worker, dropped in both starts
        assert forked["privileges"]["uid"][0] != 0 and launched["privileges"]["uid"][0] != 0
    assert forked["privileges"]["capabilities"] == "none" and forked["privileges"]["no_new_privs"]
    strip = lambda b: {k: v for k, v in b.items() if k not in ("uid",)}  # noqa: E731
    assert strip(forked["isolation"]) == strip(launched["isolation"])
    # What the implementation sees: the session's environment (its own HOME, caches, TMPDIR), its own
    # directory and process group.
    same_env = lambda e, home: {k: v.replace(home, "HOME") for k, v in e.items()  # noqa: E731
                                if k not in ("USER", "LOGNAME")}  # the drawn uid's name
    assert same_env(seen_f["environ"], seen_f["environ"]["HOME"]) == same_env(seen_l["environ"], seen_l["environ"]["HOME"])
    assert seen_f["tmp"].startswith(seen_f["environ"]["HOME"])
    assert seen_f["cwd"] == seen_f["environ"]["HOME"] and seen_f["pgid"] == forked["pid"]
    # the same numerics: torch's thread count; and a generator seeded afresh per worker, as by a fresh
    # import of torch (a fork alone would give every worker of one zygote the zygote's seed)
    _, again = _run(tmp_path, monkeypatch, "1b")
    assert seen_f["threads"] == seen_l["threads"] and seen_f["seed"] != again["seed"]
    # no descriptor of the zygote's: the forked worker holds fewer (the spawn bootstrap's sentinel
    # pipe and tracker are the launched one's only), of no other kind
    kinds = lambda fds: sorted(fds.values())  # noqa: E731
    assert len(seen_f["fds"]) <= len(seen_l["fds"]) and set(kinds(seen_f["fds"])) <= set(kinds(seen_l["fds"])), \
        (seen_f["fds"], seen_l["fds"])
    assert kinds(seen_f["fds"]).count("socket") == kinds(seen_l["fds"]).count("socket")


def test_the_zygote_is_not_used_on_cuda_or_in_a_sandbox(monkeypatch):
    monkeypatch.delenv(zygote.ENV_SWITCH, raising=False)
    assert not zygote.wanted("cuda", False)
    assert not zygote.wanted("cpu", True)
    monkeypatch.setenv(zygote.ENV_SWITCH, "0")
    assert not zygote.wanted("cpu", False)


def test_forked_reads_the_exit_status_of_its_child():
    proc = subprocess.Popen(["sh", "-c", "kill -SEGV $$"])
    handle = zygote.Forked(proc.pid)
    assert handle.wait(timeout=30) == -11 and handle.poll() == -11
    quick = subprocess.Popen(["sh", "-c", "sleep 5"])
    handle = zygote.Forked(quick.pid)
    with pytest.raises(subprocess.TimeoutExpired):
        handle.wait(timeout=0.05)
    quick.kill()
    assert handle.wait(timeout=30) == -9
    assert json.dumps(handle.returncode) == "-9"
