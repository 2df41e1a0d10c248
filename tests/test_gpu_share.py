"""Slots sharing a GPU (grpo_conform/gpu_share.py): a writer's section excludes every reader's work,
readers share, a waiting writer gets in at the readers' next yield point, and each side synchronizes
its device before letting go. Processes with a fake device; the GPU run is in docs/timing.md."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from grpo_conform import gpu_share
from grpo_conform.gate.parallel import plan_slots
from grpo_conform.phases import PhaseClock

CTX = multiprocessing.get_context("fork")


def _reader(prefix, stamps, syncs, until):
    share = gpu_share.GpuShare(prefix, lambda: syncs.append(time.monotonic()))
    while time.monotonic() < until:
        share.point()
        stamps.append(time.monotonic())  # "GPU work" of this reader, between two yield points
        time.sleep(0.004)
    share.close()


def _writer(prefix, window, start_at, hold):
    share = gpu_share.GpuShare(prefix, lambda: None)
    while time.monotonic() < start_at:
        share.point()
        time.sleep(0.004)
    window.append(time.monotonic())  # asked
    with share.exclusive():
        window.append(time.monotonic())  # in
        time.sleep(hold)
        window.append(time.monotonic())  # out
    share.close()


def test_a_timed_section_runs_alone_and_readers_share_the_rest(tmp_path):
    prefix = str(tmp_path / "gpu0")
    with CTX.Manager() as m:
        stamps = [m.list(), m.list()]
        syncs = [m.list(), m.list()]
        window = m.list()
        t0 = time.monotonic()
        procs = [CTX.Process(target=_reader, args=(prefix, stamps[i], syncs[i], t0 + 1.6)) for i in range(2)]
        procs.append(CTX.Process(target=_writer, args=(prefix, window, t0 + 0.5, 0.4)))
        for p in procs:
            p.start()
        for p in procs:
            p.join(20)
            assert p.exitcode == 0
        asked, inside, out = window
        stamps = [list(s) for s in stamps]
        syncs = [list(s) for s in syncs]
    assert inside - asked < 0.3  # readers reach a yield point every few ms: the writer waits for no more
    for s, sy in zip(stamps, syncs):
        assert not [t for t in s if inside <= t <= out], "a reader worked while the timed section ran"
        assert [t for t in s if t < asked] and [t for t in s if t > out]  # before and after it
        assert sy and all(t <= inside for t in sy[:1])  # it synchronized before letting the writer in
    # the two readers overlapped: each worked while the other held the lock too
    both = sorted([(t, 0) for t in stamps[0] if t < asked] + [(t, 1) for t in stamps[1] if t < asked])
    assert sum(1 for a, b in zip(both, both[1:]) if a[1] != b[1]) > 10


def test_writers_take_turns_and_nested_sections_are_one(tmp_path):
    prefix = str(tmp_path / "gpu0")
    with CTX.Manager() as m:
        windows = [m.list(), m.list()]
        t0 = time.monotonic()
        procs = [CTX.Process(target=_writer, args=(prefix, windows[i], t0 + 0.2, 0.3)) for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(20)
            assert p.exitcode == 0
        (_, in0, out0), (_, in1, out1) = [list(w) for w in windows]
    assert out0 <= in1 or out1 <= in0  # never both inside
    share = gpu_share.GpuShare(prefix, lambda: None)
    with share.exclusive():
        with share.exclusive():
            assert share.depth == 2
        assert share.depth == 1 and share.point() is False  # no yield inside a section
    assert share.depth == 0
    share.close()


def test_off_unless_the_slot_was_started_to_share(monkeypatch, tmp_path):
    monkeypatch.delenv(gpu_share.ENV_SHARE, raising=False)
    assert gpu_share.start(lambda: None) is None
    assert gpu_share.point() is False and gpu_share.sharing_slots() == 1
    with gpu_share.exclusive():
        pass
    monkeypatch.setenv(gpu_share.ENV_SHARE, str(tmp_path / "gpu0"))
    monkeypatch.setenv(gpu_share.ENV_SLOTS, "3")
    try:
        assert gpu_share.start(lambda: None) is not None
        assert gpu_share.sharing_slots() == 3 and gpu_share.point() is False  # no writer: no wait
    finally:
        gpu_share.stop()
    assert gpu_share.sharing_slots() == 1


def test_a_wait_at_a_yield_point_counts_as_gpu_wait_not_in_the_phase():
    clock = PhaseClock()
    clock.on_enter = lambda: time.sleep(0.05) is None  # waited 50 ms
    with clock("worker"):
        pass
    out = clock.to_json()["exclusive_s"]
    assert out["gpu-wait"] >= 0.05 and out["worker"] < 0.04
    clock.on_enter = lambda: False
    with clock("judge"):
        pass
    assert clock.counts["gpu-wait"] == 1


def test_timed_slots_share_a_gpu_only_when_one_implementation_runs(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots, notes = plan_slots("cuda", (0,), 3, True, 1, share=True)
    assert [s.name for s in slots] == ["gpu0.1", "gpu0.2", "gpu0.3"]
    assert {s.share for s in slots} == {"gpu0"} and all(s.env[gpu_share.ENV_SLOTS] == "3" for s in slots)
    assert any("timed call runs alone" in n for n in notes)
    slots, notes = plan_slots("cuda", (0,), 3, True, 1, share=False)  # several implementations
    assert [s.name for s in slots] == ["gpu0"] and slots[0].share is None and notes
    slots, _ = plan_slots("cuda", (0,), 2, False, 1, share=True)  # untimed: nothing to keep apart
    assert all(s.share is None and gpu_share.ENV_SLOTS not in s.env for s in slots)


@pytest.mark.parametrize("cores,expected", [(16, 4), (8, 2), (2, 1)])
def test_jobs_auto_on_cuda_is_a_slot_per_four_cores_for_one_implementation(monkeypatch, cores, expected):
    import torch

    from conftest import GALLERY, ROOT
    from grpo_conform.check import CheckRequest
    from grpo_conform.gate import parallel
    from grpo_conform.gate.plan import build_plan

    CPU = torch.device("cpu")

    plan = build_plan(CheckRequest((str(ROOT / "implementations" / "pytorch"),)), CPU)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert parallel.auto_jobs(plan, "cuda") == expected
    assert parallel.auto_jobs(plan, "cuda", fail_fast=True) == 1
    two = build_plan(CheckRequest((str(ROOT / "implementations" / "pytorch"), str(GALLERY / "float64-eager"))), CPU)
    assert parallel.auto_jobs(two, "cuda") == 1  # two implementations: their workers never share a GPU


def _holder(prefix, nbytes, hold, log, ready=None, release=True):
    share = gpu_share.GpuShare(prefix, lambda: None, capacity=100)
    share.acquire(nbytes)
    log.append(("in", nbytes, time.monotonic()))
    if ready is not None:
        ready.set()
    time.sleep(hold)
    log.append(("out", nbytes, time.monotonic()))
    if release:
        share.release()
    share.close() if release else None  # a slot that dies holding its reservation: the process just ends


def test_workloads_wait_for_memory_the_others_hold(tmp_path):
    prefix = str(tmp_path / "gpu0")
    with CTX.Manager() as m:
        log, ready = m.list(), m.Event()
        a = CTX.Process(target=_holder, args=(prefix, 60, 0.5, log, ready))
        a.start()
        assert ready.wait(10)
        b = CTX.Process(target=_holder, args=(prefix, 50, 0.1, log))  # 60 + 50 > 100: waits for a
        c = CTX.Process(target=_holder, args=(prefix, 30, 0.1, log))  # 60 + 30 fits: runs beside a
        for p in (b, c):
            p.start()
        for p in (a, b, c):
            p.join(20)
            assert p.exitcode == 0
        events = {(kind, n): t for kind, n, t in log}
    assert events[("in", 50)] >= events[("out", 60)]
    assert events[("in", 30)] < events[("out", 60)]


def test_a_dead_slots_reservation_is_ignored_and_a_lone_workload_always_runs(tmp_path):
    prefix = str(tmp_path / "gpu0")
    with CTX.Manager() as m:
        log = m.list()
        dead = CTX.Process(target=_holder, args=(prefix, 90, 0.0, log, None, False))  # exits holding 90
        dead.start()
        dead.join(10)
    share = gpu_share.GpuShare(prefix, lambda: None, capacity=100)
    t0 = time.monotonic()
    assert share.acquire(80) is False and time.monotonic() - t0 < 1.0  # 90 + 80 > 100, but its slot is gone
    share.release()
    assert share.acquire(500) is False  # more than the capacity, alone: it runs
    share.release()
    share.close()
