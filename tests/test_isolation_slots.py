"""Issue 28 item 2 and issue 27 item 4: workers cannot reach each other, and no fixed uid marks them.

Each worker's uid is drawn from a range (isolation/uids.py); `--jobs` slots draw from disjoint
blocks (gate/parallel.py). With `--jobs 2`, an implementation that SIGKILLs every process it can
see, all the time, cannot take down the other slot's honest worker. A worker killed from outside
while it loads is reported as killed, and the run stops with exit 3 (WorkerKilled), not as the
implementation's load error; a fault of its own (SIGSEGV) stays its load error.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, cli_here
from worker_steps import call_once
from grpo_conform.errors import EXIT_ENVIRONMENT, EnvironmentProblem
from grpo_conform.gate import parallel
from grpo_conform.implementations import load_implementation
from grpo_conform.isolation import privilege, uids
from grpo_conform.isolation.session import WorkerFailure, WorkerKilled, WorkerSession

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="drawn uids need a validator running as root")
MANIFEST = """\
name = "{name}"
spec = "grpo-token-is"
entry = "impl:grpo_loss"
language = "python"
license = "MIT"
devices = ["cpu"]
description = "isolation between slots"
"""


def _folder(tmp_path: Path, name: str, source: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "implementation.toml").write_text(MANIFEST.format(name=name))
    (folder / "impl.py").write_text(source)
    (folder / "eager.py").write_text((ROOT / "implementations" / "pytorch" / "impl.py").read_text())
    return folder


def _session(folder: Path, timeout: float = 60.0) -> WorkerSession:
    return WorkerSession(load_implementation(folder), {"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0},
                         torch.device("cpu"), timeout)


# -- drawn uids ------------------------------------------------------------------------------------
def test_the_uid_range_setting(monkeypatch):
    monkeypatch.delenv(uids.ENV_UIDS, raising=False)
    assert uids.uid_range() == uids.DEFAULT_RANGE
    assert uids.uid_range("70000-70009") == (70000, 70009)
    for bad in ("0-10", "x-y", "10-5", "-3"):
        with pytest.raises(EnvironmentProblem, match=uids.ENV_UIDS):
            uids.uid_range(bad)
    blocks = uids.split(100, 199, 3)
    assert blocks == [(100, 132), (133, 165), (166, 198)]
    with pytest.raises(EnvironmentProblem, match="fewer uids than slots"):
        uids.split(5, 6, 3)


@ROOT_ONLY
def test_every_worker_draws_a_uid_of_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv(privilege.ENV_USER, raising=False)
    monkeypatch.setenv(uids.ENV_UIDS, "70000-70003")
    folder = _folder(tmp_path, "honest", "from eager import grpo_loss\n")
    sessions = [_session(folder) for _ in range(4)]  # drawn at creation: four from a range of four
    try:
        drawn = [s.identity for s in sessions]
        assert sorted(i.uid for i in drawn) == [70000, 70001, 70002, 70003] and all(i.drawn for i in drawn)
        with pytest.raises(EnvironmentProblem, match="no free uid"):
            _session(folder)
    finally:
        for s in sessions:
            s.close()
    again = _session(folder)  # released at close
    assert again.identity.uid in range(70000, 70004)
    again.close()
    monkeypatch.setenv(privilege.ENV_USER, "nobody")  # named: fixed, the user's choice, and not drawn
    fixed = _session(folder)
    assert fixed.identity.uid == privilege.NOBODY and not fixed.identity.drawn
    fixed.close()


@ROOT_ONLY
def test_slots_draw_from_disjoint_blocks(monkeypatch):
    monkeypatch.delenv(privilege.ENV_USER, raising=False)
    monkeypatch.delenv(uids.ENV_UIDS, raising=False)
    slots, notes = parallel.with_uid_blocks([parallel.Slot(f"cpu{i}", {}) for i in range(1, 4)])
    ranges = [uids.uid_range(s.env[uids.ENV_UIDS]) for s in slots]
    assert notes == [] and all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    monkeypatch.setenv(privilege.ENV_USER, "nobody")
    _, notes = parallel.with_uid_blocks([parallel.Slot("cpu1", {}), parallel.Slot("cpu2", {})])
    assert "can signal each other" in notes[0]


# -- killed from outside ----------------------------------------------------------------------------
SLOW_IMPORT = textwrap.dedent("""\
    import os, time
    with open(os.path.join(os.environ["HOME"], "pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    from eager import grpo_loss
""")


def _kill_when_loading(session: WorkerSession, sig: int) -> threading.Thread:
    def kill():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pid_file = session.directory / "home" / "pid" if session.directory else None
            if pid_file is not None and pid_file.is_file() and pid_file.read_text():
                os.kill(int(pid_file.read_text()), sig)
                return
            time.sleep(0.05)

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_a_worker_killed_from_outside_while_loading_is_an_environment_problem(tmp_path):
    session = _session(_folder(tmp_path, "killed", SLOW_IMPORT))
    killer = _kill_when_loading(session, signal.SIGKILL)
    try:
        with pytest.raises(WorkerKilled) as info:
            session.start()
    finally:
        session.close()
        killer.join()
    assert info.value.exit_code == EXIT_ENVIRONMENT
    assert not isinstance(info.value, WorkerFailure)  # not the implementation's load error
    assert "killed by signal SIGKILL while loading it" in str(info.value)


@pytest.mark.slow
def test_a_fault_of_its_own_while_loading_stays_the_implementations(tmp_path):
    session = _session(_folder(tmp_path, "faults", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"))
    try:
        with pytest.raises(WorkerFailure) as info:
            session.start()
    finally:
        session.close()
    assert info.value.kind == "crash" and "SIGSEGV" in str(info.value)


# -- --jobs 2: a saboteur beside an honest implementation --------------------------------------------
KILLER = textwrap.dedent("""\
    import os, signal, threading, time
    from eager import grpo_loss as _honest

    KILLED = []

    def _kill_everything():
        me = os.getpid()
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != me:
                try:
                    os.kill(int(name), signal.SIGKILL)
                    KILLED.append(int(name))
                except OSError:
                    pass

    def _forever():
        while True:
            _kill_everything()
            time.sleep(0.02)

    threading.Thread(target=_forever, daemon=True).start()

    def grpo_loss(*args, **kwargs):
        if KILLED:  # it reached another process: say so, so that the test sees it
            raise RuntimeError("killed " + str(sorted(set(KILLED))[:20]))
        return _honest(*args, **kwargs)
""")


@ROOT_ONLY
@pytest.mark.slow
def test_jobs_2_a_saboteur_cannot_take_down_the_honest_slot(tmp_path):
    honest = _folder(tmp_path, "honest", "from eager import grpo_loss\n")
    killer = _folder(tmp_path, "kills-others", KILLER)
    # the parent in this process (cli_here), the two slots processes of their own as always: a parent
    # process paid a python and torch more (docs/timing.md, "Fifth pass"); a killer that reached this
    # process would end the test run itself, which fails it as loudly
    run = cli_here("check", killer, honest, "--device", "cpu", "--workload", "batch1-seq1", "--jobs", "2",
                   "--no-evidence", "--format", "json", env_extra={privilege.ENV_USER: None, uids.ENV_UIDS: None})
    import json

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(run.stdout)
    status = {i["name"]: i["status"] for i in doc["implementations"]}
    assert status == {"honest": "conformant", "kills-others": "conformant"}, doc
    workers = {i["name"]: i["worker"]["user"]["uid"] for i in doc["implementations"]}
    assert workers["honest"] != workers["kills-others"]


# -- /proc of others -----------------------------------------------------------------------------------
SEES = textwrap.dedent("""\
    import json, os
    def grpo_loss(*args, **kwargs):
        seen = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    seen[name] = os.stat("/proc/" + name).st_uid
                except OSError:
                    pass
        raise ValueError(json.dumps({"me": os.getuid(), "seen": seen}))
""")


@ROOT_ONLY
@pytest.mark.slow
def test_a_worker_sees_no_process_of_another_uid_in_proc(tmp_path, monkeypatch):
    """hidepid=2 on a procfs of its own (kernel 5.8+): not the validator, not another slot's worker."""
    import json

    from grpo_conform.isolation import namespaces

    if not namespaces.wanted("cpu", False)["proc"]:
        pytest.skip("kernel older than 5.8: proc mount options are shared with the host's /proc")
    monkeypatch.delenv(privilege.ENV_USER, raising=False)
    with _session(_folder(tmp_path, "sees", SEES)) as session:
        assert session.info["isolation"]["proc"] == "hidepid=2"
        g = torch.Generator().manual_seed(0)
        descriptors = {}
        for name, t in {"logits": torch.randn(1, 2, 11, generator=g).to(torch.bfloat16),
                        "completion_ids": torch.tensor([[3]]), "advantages": torch.tensor([0.5])}.items():
            _, descriptors[name] = session.allocator.share(t)
        session.bind("in", descriptors)
        with pytest.raises(WorkerFailure) as info:
            call_once(session)
    out = json.loads(info.value.error["message"])
    assert out["seen"] and set(out["seen"].values()) == {out["me"]}, out  # its own processes only
    assert str(os.getpid()) not in out["seen"]
    assert "hidepid" not in Path("/proc/self/mountinfo").read_text()  # the host's /proc is as it was


# -- a kill while loading fails the run with exit 3, serial and in slots --------------------------------
SIGKILLED_AT_IMPORT = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"


@pytest.mark.slow
def test_a_run_whose_worker_is_killed_while_loading_stops_with_exit_3(tmp_path):
    """Serial: run_check raises WorkerKilled (the CLI's exit 3), nothing is reported as a load error."""
    from grpo_conform.check import CheckRequest, run_check

    folder = _folder(tmp_path, "killed-at-import", SIGKILLED_AT_IMPORT)
    with pytest.raises(WorkerKilled) as info:
        run_check(CheckRequest((str(folder),), device="cpu", workloads=("batch1-seq1",), timeout=60))
    assert info.value.exit_code == EXIT_ENVIRONMENT and "killed-at-import" in str(info.value)


@ROOT_ONLY
@pytest.mark.slow
def test_a_slot_whose_worker_is_killed_while_loading_fails_the_run_with_exit_3(tmp_path):
    killed = _folder(tmp_path, "killed-at-import", SIGKILLED_AT_IMPORT)
    honest = _folder(tmp_path, "honest", "from eager import grpo_loss\n")
    run = cli_here("check", killed, honest, "--device", "cpu", "--workload", "batch1-seq1", "--jobs", "2",
                   "--no-evidence")  # the parent in this process, the slots processes (see the test above)
    assert run.returncode == EXIT_ENVIRONMENT, run.stdout[-2000:] + run.stderr[-2000:]
    # the whole stderr on failure: one loaded run (2026-12-05) printed a slot's traceback, its text cut off
    assert "not of an implementation" in run.stderr and "killed by signal SIGKILL while loading" in run.stderr, \
        run.stderr[-6000:]
    assert "Traceback" not in run.stderr, run.stderr[-6000:]
