"""The GPU gate of slots sharing one GPU (grpo_conform/gate/gpu_share.py): who may hold what, when.

Timing honesty rests on one rule, that an exclusive hold is granted only while no slot holds anything
(a present slot's worker may have work on the GPU); memory grants keep side-by-side workloads within
the GPU. Each test breaks one of them in a way a wrong arbiter would let through."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from grpo_conform import device_memory
from grpo_conform.gate.gpu_share import ENV_FDS, GateClient, GateError, GpuArbiter, serve

GB = 1 << 30


class Recorder:
    def __init__(self):
        self.granted: list[str] = []
        self.tokens: dict[str, int] = {}

    def __call__(self, name):
        def grant(token):
            self.granted.append(name)
            self.tokens[name] = token
        return grant


def test_memory_grants_stay_within_capacity_in_arrival_order():
    a, got = GpuArbiter(slots=3, capacity=100 * GB), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s2", "present", 0, got("p2"))
    a.request("s3", "present", 0, got("p3"))
    a.request("s1", "memory", 60 * GB, got("m1"))
    a.request("s2", "memory", 50 * GB, got("m2"))  # 110 > 100: waits
    a.request("s3", "memory", 10 * GB, got("m3"))  # would fit, but must not pass m2 (m2 would starve)
    assert got.granted == ["p1", "p2", "p3", "m1"]
    a.release("s1", got.tokens["m1"])
    assert got.granted[-2:] == ["m2", "m3"] and a.used() == 60 * GB


def test_a_request_larger_than_the_gpu_runs_alone():
    a, got = GpuArbiter(slots=2, capacity=10 * GB), Recorder()
    a.request("s1", "memory", 4 * GB, got("small"))
    a.request("s2", "memory", 30 * GB, got("huge"))
    assert got.granted == ["small"]
    a.release("s1", got.tokens["small"])
    assert got.granted == ["small", "huge"]


def test_exclusive_waits_until_no_slot_holds_anything():
    a, got = GpuArbiter(slots=2, capacity=100 * GB), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s2", "present", 0, got("p2"))
    a.request("s1", "memory", GB, got("m1"))
    a.release("s1", got.tokens["m1"])
    a.release("s1", got.tokens["p1"])
    a.request("s1", "exclusive", 0, got("x1"))
    assert "x1" not in got.granted  # s2 is still present: its worker may have work on the GPU
    a.request("s2", "memory", GB, got("m2"))  # a present slot's workloads go on: no deadlock
    assert got.granted[-1] == "m2"
    a.request("s3", "present", 0, got("p3"))  # a new job waits behind the timing asked for
    a.release("s2", got.tokens["m2"])
    assert "x1" not in got.granted
    a.release("s2", got.tokens["p2"])
    assert got.granted[-1] == "x1" and "p3" not in got.granted
    a.request("s2", "exclusive", 0, got("x2"))
    assert got.granted[-1] == "x1"  # one exclusive at a time
    a.release("s1", got.tokens["x1"])
    assert got.granted[-1] == "x2" and "p3" not in got.granted  # timing first, in arrival order
    a.release("s2", got.tokens["x2"])
    assert got.granted[-1] == "p3"


def test_try_grants_the_turn_at_once_only_to_a_slot_alone_with_its_presence():
    """`try_exclusive`: the last slot to finish conformance times at once in its worker. Granted only when
    every hold is its own: never while another slot is present (its worker may have work queued), holds
    memory, or times; never queued; and what it grants blocks everything else as any exclusive does.
    (try_wait=0: refused at once; the wait for slots finishing at the same moment is the next test's.)"""
    a, got = GpuArbiter(slots=3, capacity=100 * GB, try_wait=0), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s2", "present", 0, got("p2"))
    assert a.try_exclusive("s1") == 0 and not a.pending  # s2 is present
    a.release("s2", got.tokens["p2"])
    a.request("s2", "exclusive", 0, got("x2"))  # s2 finished first: it waits in the queue, holding nothing
    a.request("s3", "memory", GB, got("m3"))  # a slot that holds memory (no presence: a hostile or broken one)
    assert got.granted[-1] == "m3" and a.try_exclusive("s1") == 0
    a.release("s3", got.tokens["m3"])
    token = a.try_exclusive("s1")
    assert token and "x2" not in got.granted
    a.request("s3", "present", 0, got("p3"))
    assert got.granted[-1] == "m3"  # nothing beside it
    assert a.try_exclusive("s2") == 0  # nor a second one
    a.release("s1", token)
    assert "x2" not in got.granted  # s1 is still present: its worker is open until it lets go
    a.release("s1", got.tokens["p1"])
    assert got.granted[-1] == "x2" and "p3" not in got.granted
    a.retire("s3")
    assert a.try_exclusive("s3") == 0


def test_two_slots_finishing_together_leave_the_turn_to_the_first_that_asked():
    """Two slots finish conformance moments apart: the first `try` waits (up to try_wait) instead of being
    refused beside the other's presence; the second is refused at once, lets go, and the first is granted.
    Before, both were refused (round32a at a7a99a9 on the H200: no turn in a warm worker). An arbiter that
    grants the second, or grants the first while the second is still present, fails here."""
    a, got = GpuArbiter(slots=2, capacity=100 * GB, try_wait=30), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s2", "present", 0, got("p2"))
    first: list[int] = []
    waiter = threading.Thread(target=lambda: first.append(a.try_exclusive("s1")))
    waiter.start()
    deadline = time.monotonic() + 5
    while "s1" not in a.trying and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "s1" in a.trying and not first  # waiting: s2 is still present
    assert a.try_exclusive("s2") == 0  # asked second: refused at once, while s1 waits
    assert not first and [h.kind for h in a.holds.values()] == ["present", "present"]
    a.release("s2", got.tokens["p2"])  # s2 closes its worker and lets go
    waiter.join(5)
    assert first and first[0] and a.holds[first[0]].slot == "s1" and a.holds[first[0]].kind == "exclusive"
    assert not a.trying


def test_a_try_that_nobody_answers_is_refused_after_its_wait():
    """The other slot is still in its conformance: the try gives up after try_wait, holding nothing new."""
    a, got = GpuArbiter(slots=2, capacity=100 * GB, try_wait=0.2), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s2", "present", 0, got("p2"))
    a.request("s2", "memory", GB, got("m2"))
    start = time.monotonic()
    assert a.try_exclusive("s1") == 0
    assert 0.15 <= time.monotonic() - start < 5 and not a.trying
    assert sorted(h.kind for h in a.holds.values()) == ["memory", "present", "present"]


def test_nothing_but_an_exclusive_is_granted_beside_an_exclusive():
    a, got = GpuArbiter(slots=2, capacity=100 * GB), Recorder()
    a.request("s1", "exclusive", 0, got("x1"))
    a.request("s2", "memory", GB, got("m2"))
    assert got.granted == ["x1"]
    a.release("s1", got.tokens["x1"])
    assert got.granted == ["x1", "m2"]


def test_a_slot_that_exits_loses_what_it_held_and_asked_for():
    a, got = GpuArbiter(slots=2, capacity=10 * GB), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s1", "memory", 8 * GB, got("m1"))
    a.request("s2", "memory", 8 * GB, got("m2"))
    a.request("s1", "exclusive", 0, got("late"))  # waits: slots hold memory
    a.drop("s1")
    assert got.granted == ["p1", "m1", "m2"] and not a.pending  # s1's pending request went with it
    with pytest.raises(GateError):
        a.release("s2", got.tokens["m1"])  # nobody releases another slot's hold


def test_capacity_comes_from_the_first_slot_s_report():
    a = GpuArbiter(slots=4)
    a.set_total(100 * GB)
    a.set_total(1 * GB)  # a later report does not shrink it mid-run
    assert a.capacity == int(100 * GB * 0.9) - 4 * GB


def _served(arbiter, name):
    grant_r, grant_w = os.pipe()
    request_r, request_w = os.pipe()
    thread = threading.Thread(target=serve, args=(arbiter, name, os.fdopen(request_r, "r"), os.fdopen(grant_w, "w")),
                              daemon=True)
    thread.start()
    return GateClient(grant_r, request_w), thread


def test_client_and_server_over_pipes_and_a_closed_client_drops_its_holds():
    arbiter = GpuArbiter(slots=2, capacity=10 * GB, try_wait=0)
    one, t1 = _served(arbiter, "one")
    two, t2 = _served(arbiter, "two")
    one.report_total(20 * GB)
    token = one.acquire("memory", 9 * GB)
    waiter: list[int] = []
    thread = threading.Thread(target=lambda: waiter.append(two.acquire("memory", 9 * GB)))
    thread.start()
    thread.join(0.3)
    assert not waiter  # blocked: 18 GB do not fit in 10
    one._out.close()  # the slot exits holding its grant
    t1.join(5)
    thread.join(5)
    assert waiter and not t1.is_alive()
    two.release(waiter[0])
    exclusive = two.acquire("exclusive")
    assert [h.kind for h in arbiter.holds.values()] == ["exclusive"]
    two.release(exclusive)
    arbiter.request("three", "present", 0, lambda token: None)
    assert two.try_exclusive() == 0  # answered at once, over the same pipes: refused beside another's hold
    arbiter.drop("three")
    exclusive = two.try_exclusive()
    assert exclusive and [h.kind for h in arbiter.holds.values()] == ["exclusive"]
    two.release(exclusive)
    assert token  # the dead slot's token is gone with it
    two._out.close()
    t2.join(5)


def test_a_slot_speaking_nonsense_loses_its_holds():
    arbiter = GpuArbiter(slots=1, capacity=10 * GB)
    client, thread = _served(arbiter, "bad")
    client.acquire("memory", GB)
    client._send(gate="release", token=12345)  # a hold it never had: the server stops serving it
    thread.join(5)
    assert not thread.is_alive() and not arbiter.holds
    with pytest.raises(GateError):
        client.acquire("memory", GB)


def test_the_gate_s_descriptors_never_reach_the_slot_s_children(monkeypatch):
    grant_r, grant_w = os.pipe()
    request_r, request_w = os.pipe()
    for fd in (grant_r, request_w):
        os.set_inheritable(fd, True)  # as pass_fds leaves them in the slot
    monkeypatch.setenv(ENV_FDS, f"{grant_r},{request_w}")
    client = GateClient.from_environment()
    assert client is not None and ENV_FDS not in os.environ  # a worker's environment never names them
    assert not os.get_inheritable(grant_r) and not os.get_inheritable(request_w)
    child = subprocess.run([sys.executable, "-c", f"import os; os.fstat({request_w})"], close_fds=False,
                           capture_output=True)
    assert child.returncode != 0  # not open in a child, even one that keeps every inheritable descriptor
    for fd in (grant_w, request_r):
        os.close(fd)
    monkeypatch.setenv(ENV_FDS, "seven")
    with pytest.raises(GateError):
        GateClient.from_environment()


def test_a_grant_caps_the_free_memory_a_workload_sizes_by(monkeypatch):
    monkeypatch.setattr(device_memory.torch.cuda, "mem_get_info", lambda device=None: (80 * GB, 140 * GB))
    assert device_memory.free_bytes("cuda") == 80 * GB
    with device_memory.granted(30 * GB):
        assert device_memory.free_bytes("cuda") == 30 * GB
        with device_memory.granted(None):
            assert device_memory.free_bytes("cuda") == 80 * GB
    assert device_memory.free_bytes("cuda") == 80 * GB
    assert device_memory.estimate(2 * GB, 2 * GB) == device_memory.SETS_PER_WORKLOAD * 2 * GB + device_memory.FIXED_BYTES
    assert device_memory.estimate(2 * GB, 3 * GB) == device_memory.estimate(3 * GB, 1 * GB)  # the larger set counts
    assert device_memory.estimate(2 * GB, 2 * GB) < device_memory.estimate(2 * GB, 3 * GB)


def test_two_implementations_are_never_present_together():
    a, got = GpuArbiter(slots=3, capacity=100 * GB), Recorder()
    a.request("s1", "present", 0, got("a1"), tag="impl-a")
    a.request("s2", "present", 0, got("b1"), tag="impl-b")  # another implementation: waits
    a.request("s3", "present", 0, got("a2"), tag="impl-a")  # not before b1, which asked first (no starvation)
    assert got.granted == ["a1"]
    a.release("s1", got.tokens["a1"])
    assert got.granted == ["a1", "b1"]
    a.release("s2", got.tokens["b1"])
    assert got.granted == ["a1", "b1", "a2"]


def test_nothing_is_heard_in_the_name_of_a_slot_that_exited():
    a, got = GpuArbiter(slots=2, capacity=100 * GB), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.retire("s1")  # its process exited; a child of it may still hold its pipe
    a.request("s1", "exclusive", 0, got("x-forged"))
    a.request("s2", "present", 0, got("p2"))
    assert got.granted == ["p1", "p2"] and not any(r.slot == "s1" for r in a.pending)


def test_a_try_for_memory_is_granted_only_at_once_and_never_queued():
    """check_ahead's proxies ask with `try`: granted when it fits beside what is held and nothing waits; a
    queued workload's memory, an exclusive held or asked for, or no room refuses it (0), and it never waits."""
    a, got = GpuArbiter(slots=2, capacity=100 * GB), Recorder()
    a.request("s1", "present", 0, got("p1"))
    a.request("s2", "present", 0, got("p2"))
    a.request("s1", "memory", 90 * GB, got("m1"))
    assert a.try_memory("s2", 20 * GB) == 0  # no room
    token = a.try_memory("s2", 10 * GB)
    assert token and a.used() == 100 * GB
    a.request("s3", "memory", 5 * GB, got("m2"))  # queued: no room
    a.release("s1", got.tokens["m1"])
    assert got.granted[-1] == "m2"
    a.request("s1", "memory", 90 * GB, got("m3"))  # queued: no room beside the 15 GB held
    assert a.try_memory("s2", 1) == 0  # a queued request is never passed
    a.release("s2", token)
    a.release("s3", got.tokens["m2"])
    a.release("s1", got.tokens["m3"])
    a.request("s1", "exclusive", 0, got("x"))  # asked for (presences held): nothing more is granted
    assert a.try_memory("s2", 1) == 0
    assert GpuArbiter(slots=1).try_memory("s1", 1) == 0  # no capacity known yet


def test_a_try_for_memory_over_the_pipes(monkeypatch):
    a = GpuArbiter(slots=1, capacity=10 * GB)
    client, thread = _served(a, "s1")
    token = client.try_memory(GB)
    assert token and a.used() == GB
    assert client.try_memory(20 * GB) == 0
    client.release(token)
    client._out.close()
    thread.join(5)
    assert a.used() == 0


class _LocalGate:
    """A slot's GateClient talking to an arbiter in this process (blocking acquire, try, release)."""

    def __init__(self, arbiter, slot):
        self.arbiter, self.slot = arbiter, slot

    def acquire(self, kind, nbytes=0, tag=""):
        granted, box = threading.Event(), []
        self.arbiter.request(self.slot, kind, nbytes, lambda token: (box.append(token), granted.set()), tag)
        assert granted.wait(5), f"{self.slot}: {kind} {nbytes} never granted (the gate is stalled)"
        return box[0]

    def try_memory(self, nbytes):
        return self.arbiter.try_memory(self.slot, nbytes)

    def release(self, token):
        self.arbiter.release(self.slot, token)


@pytest.mark.parametrize("lets_go", [True, False])
def test_a_slot_holding_memory_lets_go_before_it_waits_in_the_queue(lets_go):
    """round35c on an H100 (thirty-first session): a slot whose compile-ahead proxies held memory waited for its
    next workload's memory behind seed-b17-big's request, which could not fit beside those proxies: every slot
    stalled. check._memory_hold tries at once, and refused, has the slot let go of what it holds before it
    queues. Without letting go, the arbiter refuses the wait (it would stall: only the slot can let go)."""
    from types import SimpleNamespace

    from grpo_conform import check

    a = GpuArbiter(slots=2, capacity=10 * GB)
    s1, s2 = _LocalGate(a, "s1"), _LocalGate(a, "s2")
    ahead = s1.try_memory(2 * GB)  # s1's compile-ahead proxies
    assert ahead
    big_granted = threading.Event()

    def big():  # s2's seed-b17-big: 9 GB, no room beside the proxies
        token = s2.acquire("memory", 9 * GB)
        big_granted.set()
        time.sleep(0.05)
        s2.release(token)

    t = threading.Thread(target=big, daemon=True)
    t.start()
    while not a.pending:
        time.sleep(0.001)
    released = []

    def let_go():
        s1.release(ahead)
        released.append(ahead)

    draws = {}
    hold = check._memory_hold(SimpleNamespace(gate=s1, device=torch.device("cpu")), GB, draws, let_go if lets_go else None)
    if not lets_go:  # the wait that stalled round35c: refused by the arbiter (GateError), never left to hang
        with pytest.raises(GateError, match="while it holds memory"):
            with hold:
                pass
        assert not big_granted.is_set()
        s1.release(ahead)
        t.join(5)
        assert big_granted.is_set()
        return
    with hold:  # granted beside the big one (9 + 1 fit), or after it
        assert released == [ahead] and big_granted.wait(5)
    t.join(5)
    assert not t.is_alive() and a.used() == 0 and draws["gpu_grant"]["bytes"] == GB


def test_a_workload_granted_at_once_keeps_its_compile_ahead_running():
    """Where the workload's memory fits at once, nothing is let go: the proxies keep compiling beside it."""
    from types import SimpleNamespace

    from grpo_conform import check

    a = GpuArbiter(slots=1, capacity=10 * GB)
    s1 = _LocalGate(a, "s1")
    assert s1.try_memory(2 * GB)
    called = []
    with check._memory_hold(SimpleNamespace(gate=s1, device=torch.device("cpu")), 3 * GB, {}, lambda: called.append(1)):
        assert a.used() == 5 * GB
    assert called == [] and a.used() == 2 * GB


def test_a_slot_cannot_queue_for_memory_while_it_holds_memory():
    """The rule _memory_hold keeps, enforced by the arbiter: a queued wait while holding memory is refused (the
    stall it could cause is silent); granted at once, the same request is fine."""
    a, got = GpuArbiter(slots=2, capacity=10 * GB), Recorder()
    held = a.try_memory("s1", 2 * GB)
    a.request("s1", "memory", 3 * GB, got("fits"))  # granted at once: no wait
    a.request("s2", "memory", 9 * GB, got("big"))  # waits for s1
    with pytest.raises(GateError, match="while it holds memory"):
        a.request("s1", "memory", GB, got("queued"))
    assert got.granted == ["fits"] and [r.slot for r in a.pending] == ["s2"]
    a.release("s1", held)
    a.release("s1", got.tokens["fits"])
    assert got.granted == ["fits", "big"]


def test_a_refused_wait_reaches_the_slot_as_its_reason():
    """Over the pipes: the slot that queues for memory while it holds memory gets the arbiter's reason (not a
    bare "gate closed"), and loses its holds, so the others go on."""
    arbiter = GpuArbiter(slots=2, capacity=10 * GB, try_wait=0)
    one, t1 = _served(arbiter, "one")
    two, t2 = _served(arbiter, "two")
    held = one.try_memory(2 * GB)
    waiter: list[int] = []
    big = threading.Thread(target=lambda: waiter.append(two.acquire("memory", 9 * GB)), daemon=True)
    big.start()
    while not arbiter.pending:
        time.sleep(0.001)
    with pytest.raises(GateError, match="refused this slot: GateError: slot one asked to wait for memory while it"):
        one.acquire("memory", GB)
    assert held and (big.join(5) or waiter)  # one's holds dropped: the big request was granted
