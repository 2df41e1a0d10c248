"""Compile ahead (grpo_conform/check_ahead.py, on by default): a slot's second worker runs the next member's calls
on proxy inputs (batch 1) without the slot waiting, its compiled kernels reach the store, a member already
begun is never sent, a failing implementation stops nothing; check.py starts it on a first run only,
steps it after every workload and closes it before the slot asks for its turn with the GPU to itself."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

from grpo_conform import ahead_proxies, check, check_ahead
from grpo_conform.gate.plan import MemberPlan, Stop
from grpo_conform.implementations import load_implementation
from grpo_conform.isolation import compile_cache
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.spec.family import load_family
from triton_compile import LEAVE_KERNEL

ROOT = Path(__file__).resolve().parent.parent

IMPL = LEAVE_KERNEL + '''
import torch


def grpo_loss(logits, completion_ids, advantages, **kw):
    """Leaves a kernel folder named by what it ran on (as a JIT compiler leaves one a specialisation)."""
    leave_kernel("b%d-v%d-g%d-%s" % (logits.shape[0], logits.shape[-1], torch.is_grad_enabled(),
                                     "-".join(sorted(k for k in kw if kw[k] is not None))))
    if os.environ.get("AHEAD_FAIL"):
        raise RuntimeError("no proxy for me")
    return logits.float().mean() * advantages.float().mean()
'''


def _members(*pairs):
    family = load_family(ROOT / "specs" / "grpo.v1.json")
    out = []
    for member, workloads in pairs:
        spec = family.member(member)
        out.append(MemberPlan(spec, tuple(spec.workload(w) for w in workloads)))
    return out


def _session(tmp_path) -> WorkerSession:
    folder = tmp_path / "impl"
    if not folder.exists():
        folder.mkdir()
        (folder / "impl.py").write_text(IMPL)
        (folder / "implementation.toml").write_text(
            'name = "ahead"\nspec = "grpo"\nmembers = ["token-is", "token-offpolicy-mask"]\nentry = "impl:grpo_loss"\n'
            'language = "torch"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "leaves a folder a call"\n')
    return WorkerSession(load_implementation(folder), {}, torch.device("cpu"), 60.0, interpret=True)


def _wait(ahead) -> None:
    end = time.monotonic() + 60
    while not ahead.session.answered():
        assert time.monotonic() < end, "no answer to precompile within 60 s"
        time.sleep(0.05)


def test_a_proxy_keeps_every_axis_but_the_batch():
    (mp,) = _members(("token-offpolicy-mask", ("mask-b8",)))
    rw = ahead_proxies.proxy_workload(mp.spec, mp.workloads[0])
    real = mp.spec.resolve(mp.workloads[0])
    assert rw.shapes["logits"] == (1,) + real.shapes["logits"][1:] and rw.dtypes == real.dtypes


def test_the_next_member_s_calls_run_in_the_second_worker_and_reach_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-is", ("small-bf16",)), ("token-offpolicy-mask", ("mask-small-bf16", "mask-b1-long")),
                       ("bnpo-mask", ("mask-small-bf16",)))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        ahead.step(0)  # sends token-offpolicy-mask's two proxies, does not wait
        assert ahead.sent == ["token-offpolicy-mask"] and ahead.pending == ["A0", "A1"]
        _wait(ahead)
        ahead.step(0)  # collects (its kernels to the store while it lives), then sends bnpo-mask's
        assert ahead.sent == ["token-offpolicy-mask", "bnpo-mask"] and ahead.session.alive
        store = ahead.session._cache_store
        kernels = sorted("-".join(p.name.split("-")[1:3]) for p in (store / ".triton").iterdir())
        # one a workload, at batch 1 (the folder's name), the vocabulary kept; the forward-only path too
        assert kernels == ["v1536-g0", "v1536-g1", "v256-g0", "v256-g1"]
        assert all(p.name.startswith("b1-") for p in (store / ".triton").iterdir())
        _wait(ahead)
        ahead.step(1)  # collected; nothing after bnpo-mask: closed
        assert ahead.session is None
    finally:
        ahead.close()


def test_a_member_already_begun_is_not_sent(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-is", ("small-bf16",)), ("token-offpolicy-mask", ("mask-small-bf16",)))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    ahead.step(1)  # the slot is on the second member already
    assert ahead.sent == [] and ahead.session is None
    assert not check_ahead.AheadCompiler.wanted(members, 1)  # check.py spawns no worker for a last member


def test_an_implementation_failing_on_a_proxy_stops_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv("AHEAD_FAIL", "1")
    members = _members(("token-is", ("small-bf16",)), ("token-offpolicy-mask", ("mask-small-bf16",)))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        ahead.step(0)
        _wait(ahead)
        ahead.step(0)
        assert ahead.sent == ["token-offpolicy-mask"] and ahead.session is None
    finally:
        ahead.close()


class _Recorder:
    """check_ahead.AheadCompiler as check.py drives it: begun once, stepped, closed (the gate's log)."""

    log: list = []
    begun: list = []

    def __init__(self, first):
        self.first, self.sent, self.stopped = first, ["bnpo-mask"], None
        self.held_bytes = 5 << 30  # its proxy, held in the slot's process while a workload is measured
        self.threads, self.side_by_side, self.shapes = 0, False, "batch1"

    report = check_ahead.AheadCompiler.report

    wanted = staticmethod(check_ahead.AheadCompiler.wanted)

    @staticmethod
    def spawn(make_session):
        session = make_session()
        session.spawn()
        _Recorder.log.append(("ahead-spawn", None))
        return session

    @classmethod
    def begin(cls, session, members, first, gate):
        cls.begun.append((first, [m.label for m in members], gate is not None))
        return cls(first)

    def step(self, current):
        _Recorder.log.append(("step", current))

    def let_go(self):
        _Recorder.log.append(("let-go", None))

    settles = False  # what settle_first answers (the slot's worker then takes the store's kernels first)

    def settle_first(self, current):
        _Recorder.log.append(("settle", current))
        return _Recorder.settles

    def close(self):
        _Recorder.log.append(("close", None))


def _slot_check(monkeypatch, gate, session_cls, run=None, settles=False):
    """check_implementation of pytorch's token-is and bnpo-mask (one small workload each) as a slot beside
    others (`gate`): its workers `session_cls`, check_ahead.AheadCompiler a _Recorder logging into the gate's
    log, run_workload replaced by `run` where given."""
    from test_timed_phase import FakeSession

    from grpo_conform.checks.timed import TimingSettings
    from grpo_conform.gate.plan import build_plan
    from grpo_conform.gate.progress import Reporter

    request = check.CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                                 members=("token-is", "bnpo-mask"), workloads=("small-bf16", "mask-small-bf16"))
    plan = build_plan(request, torch.device("cpu"))
    if run is not None:
        monkeypatch.setattr(check, "run_workload", run)
    monkeypatch.setattr(check, "WorkerSession", session_cls)
    monkeypatch.setattr(check_ahead, "AheadCompiler", _Recorder)
    FakeSession.made, FakeSession.log = [], gate.log
    _Recorder.log, _Recorder.begun = gate.log, []
    _Recorder.settles = settles
    ctx = check.RunContext(torch.device("cpu"), TimingSettings(), gate=gate)
    return check.check_implementation(plan.implementations[0], ctx, request, Reporter(None), Stop())


@pytest.mark.parametrize("reused, on, started", [(0, True, True), (12, True, False), (0, False, False)])
def test_check_starts_it_on_a_first_run_only_steps_it_and_closes_it_before_the_turn(monkeypatch, reused, on,
                                                                                        started):
    from test_timed_phase import OOM, FakeGate, FakeSession, _result

    from grpo_conform.results import CheckOutcome

    monkeypatch.setenv(check_ahead.ENV, "1" if on else "0")
    gate = FakeGate()

    def fake_run(session, spec, w, ctx, req, say, name, member, let_go=None):
        gate.log.append(("workload", member, 0, ""))
        if let_go is not None:  # conformance beside other slots (not the turn's rerun alone)
            let_go()  # what _memory_hold does where the gate refuses the workload's memory at once
        if ctx.gate is not None and member == "bnpo-mask":  # out of memory beside others: a turn follows
            return _result(CheckOutcome("runs", "error", OOM), name=w.name), object()
        return _result(CheckOutcome("runs", "pass", "every call returned"), name=w.name), object()

    class Session(FakeSession):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.info = {"compile_cache": {"reused_files": reused}}
            self.compile_cache_info = self.info["compile_cache"]

    result = _slot_check(monkeypatch, gate, Session, fake_run)
    kinds = [(e, k) for e, k, *_ in gate.log if e in ("workload", "step", "close", "release", "try")]
    if not started:
        assert _Recorder.begun == [] and ("step", 0) not in kinds
        return
    assert _Recorder.begun == [(0, ["token-is", "bnpo-mask"], True)]  # with the slot's gate
    starts = [(e, k) for e, k, *_ in gate.log if e in ("spawn", "load", "start")]
    # spawned beside the slot's worker, before that one loads: its start hides behind the slot worker's
    assert starts[:3] == [("spawn", "worker0"), ("spawn", "worker1"), ("load", "worker0")]
    assert result.worker["compile_ahead"] == {"members_sent": ["bnpo-mask"], "stopped": None, "threads": 0,
                                              "side_by_side": False, "shapes": "batch1"}  # in the report
    # what it held while a workload was measured is recorded there (check.memory_stop allows for it)
    assert result.members[0].workloads[0].draws["cuda_held_by_compile_ahead"] == 5 << 30
    steps = [k for e, k in kinds if e == "step"]
    assert steps == [0, 1]  # after each workload, with the member's index
    # each workload can make it let go of its memory before the slot waits at the gate (check._memory_hold)
    assert [e for e, *_ in gate.log if e in ("workload", "let-go")][:4] == ["workload", "let-go"] * 2
    # closed before the slot asks for its turn (its worker may still run calls), and only once
    assert kinds.index(("close", None)) < kinds.index(("try", "exclusive"))
    assert kinds.index(("close", None)) < kinds.index(("close", "worker0"))


def test_a_malformed_once_setting_is_named_before_any_worker_starts(monkeypatch):
    from test_timed_phase import FakeGate, FakeSession

    from grpo_conform.errors import EnvironmentProblem

    monkeypatch.setenv(check_ahead.ENV, "1")
    monkeypatch.setenv(check_ahead.ENV_ONCE, "yes")
    gate = FakeGate()

    class Session(FakeSession):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.info = {"compile_cache": {"reused_files": 0}}
            self.compile_cache_info = self.info["compile_cache"]

    with pytest.raises(EnvironmentProblem, match="GRPO_CONFORM_COMPILE_AHEAD_ONCE='yes'"):
        _slot_check(monkeypatch, gate, Session)
    assert _Recorder.begun == []


def test_a_settled_first_workload_takes_the_store_s_kernels_before_it_runs(monkeypatch):
    """Where the compile-ahead worker compiled the first workload's kernels (settle_first True), the slot's worker
    takes them from the store before that workload; otherwise it does not wait for them."""
    from test_timed_phase import FakeGate, FakeSession, _result

    from grpo_conform.results import CheckOutcome

    monkeypatch.setenv(check_ahead.ENV, "1")
    for settles in (True, False):
        gate = FakeGate()
        shared: list = []

        class Session(FakeSession):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.info = {"compile_cache": {"reused_files": 0}}
                self.compile_cache_info = self.info["compile_cache"]

            def share_compiled(self):
                shared.append(len(gate.log))
                gate.log.append(("share", None))

        def fake_run(session, spec, w, ctx, req, say, name, member, let_go=None):
            gate.log.append(("workload", member, 0, ""))
            return _result(CheckOutcome("runs", "pass", "every call returned"), name=w.name), object()

        _slot_check(monkeypatch, gate, Session, fake_run, settles=settles)
        kinds = [e for e, *_ in gate.log if e in ("settle", "share", "workload")]
        assert kinds[:3] == (["settle", "share", "workload"] if settles else ["settle", "workload", "share"]), kinds


def test_the_first_workload_is_compiled_and_waited_for_only_side_by_side_at_its_own_shapes(tmp_path, monkeypatch):
    """GRPO_CONFORM_COMPILE_AHEAD_THREADS with _SHAPES=workload: the first request is the slot's first workload's
    own shape, and settle_first waits for its kernels to reach the store; at batch 1 (other specialisations) or
    without threads the first workload is left to the slot's worker, and nothing waits."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-offpolicy-mask", ("mask-small-bf16", "mask-b1-long")))
    for threads, shapes in (("0", "workload"), ("2", "batch1")):
        monkeypatch.setenv(check_ahead.ENV_THREADS, threads)
        monkeypatch.setenv(check_ahead.ENV_SHAPES, shapes)
        assert not check_ahead.settles()
        ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
        try:
            assert not ahead.settle_first(0, wait_s=0.0)
            _wait(ahead)
            ahead.step(0)
        finally:
            ahead.close()
    monkeypatch.setenv(check_ahead.ENV_THREADS, "2")
    monkeypatch.setenv(check_ahead.ENV_SHAPES, "workload")
    assert check_ahead.settles() and check_ahead.AheadCompiler.wanted(_members(("token-is", ("small-bf16",))), 0)
    shutil.rmtree(tmp_path / "cache")
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        store = ahead.session._cache_store
        assert ahead.pending == ["A0"] and len(ahead.queue) == 1  # the first workload's shape, then the second's
        assert ahead.settle_first(0, wait_s=60.0)
        kernels = sorted("-".join(p.name.split("-")[:2]) for p in (store / ".triton").iterdir())
        assert kernels[:2] == ["b4-v1536", "b4-v1536"]  # mask-small-bf16, at its own batch, in the store now
        assert ahead.pending == ["A0"] and ahead.queue == []  # and the next shape already sent
    finally:
        ahead.close()


def test_threads_reach_the_worker_and_its_answer_says_whether_kernels_compiled_side_by_side(tmp_path, monkeypatch):
    """GRPO_CONFORM_COMPILE_AHEAD_THREADS goes with each request (isolation/compile_only.py in the worker); an
    implementation that never imported Triton's JIT (this one, on the CPU) runs its calls as without it."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(check_ahead.ENV_THREADS, "2")
    members = _members(("token-offpolicy-mask", ("mask-small-bf16", "mask-b1-long")))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        assert ahead.threads == 2 and ahead.side_by_side is None  # no answer yet
        store = ahead.session._cache_store
        _wait(ahead)
        ahead.step(0)
        assert ahead.side_by_side is False and ahead.session is None
        assert sorted({p.name.split("-")[1] for p in (store / ".triton").iterdir()}) == ["v256"]  # the calls ran
    finally:
        ahead.close()


@pytest.mark.parametrize("spec_file, member, workload", [("grpo.v1.json", "token-offpolicy-mask-kl", "mask-small-bf16"),
                                                          ("grpo-fused-linear.v1.json", "token-offpolicy-mask-kl-ref-weight",
                                                           None)])
def test_a_full_shape_proxy_is_drawn_at_batch_one_and_repeated(monkeypatch, spec_file, member, workload):
    """At the workloads' own shapes a proxy is one batch-1 draw repeated along the batch axis (every input, the
    ones without a batch axis as drawn): the same shapes and dtypes as the workload, a fraction of the drawing."""
    from grpo_conform.checks.buffers import input_dtypes
    from grpo_conform.ops import operation_for

    spec = load_family(ROOT / "specs" / spec_file).member(member)
    w = spec.workload(workload) if workload else next(w for w in spec.workloads if "cpu" in w.devices)
    rw = ahead_proxies.proxy_workload(spec, w, full=True)
    batch = rw.axes["batch"]
    if batch < 2:
        w = w.model_copy(update={"axes": dict(w.axes, batch=3)})
        rw, batch = ahead_proxies.proxy_workload(spec, w, full=True), 3
    op = operation_for(spec)
    drawn = []
    real_generate = type(op).generate

    def spy(self, spec_, rw_, seed, device, **kw):
        drawn.append(rw_.axes["batch"])
        return real_generate(self, spec_, rw_, seed, device, **kw)

    monkeypatch.setattr(type(op), "generate", spy)
    dtypes = input_dtypes(spec, rw)
    out = {k: torch.empty(shape, dtype=dtypes[k]) for k, shape in rw.shapes.items()}
    ahead_proxies.fill_proxy(spec, rw, 7, torch.device("cpu"), out)
    assert drawn == [1]  # one draw, at batch 1
    for name, t in out.items():
        assert t.shape == rw.shapes[name] and t.dtype == dtypes[name], name
        dims = [i for i, a in enumerate(spec.input(name).shape) if a == "batch"]
        if dims:
            first = t.narrow(dims[0], 0, 1)
            for b in range(1, batch):
                assert torch.equal(t.narrow(dims[0], b, 1), first), (name, b)
    drawn.clear()
    one = ahead_proxies.proxy_workload(spec, w)  # batch 1: drawn as it is
    out = {k: torch.empty(shape, dtype=input_dtypes(spec, one)[k]) for k, shape in one.shapes.items()}
    ahead_proxies.fill_proxy(spec, one, 7, torch.device("cpu"), out)
    assert drawn == [1]


def test_at_the_workloads_own_shapes_one_request_a_shape(tmp_path, monkeypatch):
    """GRPO_CONFORM_COMPILE_AHEAD_SHAPES=workload: what the real calls compile (a batch-1 proxy compiles other
    specialisations), one shape at a time so that one workload's memory is held at once."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(check_ahead.ENV_SHAPES, "workload")
    members = _members(("token-is", ("small-bf16",)), ("token-offpolicy-mask", ("mask-small-bf16", "mask-b1-long")))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        ahead.step(0)  # token-offpolicy-mask: two requests queued, the first sent
        assert ahead.pending == ["A0"] and len(ahead.queue) == 1 and ahead.sent == ["token-offpolicy-mask"]
        store = ahead.session._cache_store
        _wait(ahead)
        ahead.step(0)
        assert ahead.pending == ["A0"] and ahead.queue == [] and ahead.sent == ["token-offpolicy-mask"]
        _wait(ahead)
        ahead.step(0)  # nothing left: closed
        assert ahead.session is None
        kernels = sorted("-".join(p.name.split("-")[:2]) for p in (store / ".triton").iterdir())
        assert kernels == ["b1-v256", "b1-v256", "b4-v1536", "b4-v1536"]  # mask-small-bf16 at its batch of 4
    finally:
        ahead.close()


@pytest.mark.parametrize("raw, mode", [(None, "batch1"), ("", "batch1"), ("workload", "workload"), ("big", None)])
def test_the_proxy_shapes_are_read_from_the_environment(monkeypatch, raw, mode):
    from grpo_conform.errors import EnvironmentProblem

    if raw is None:
        monkeypatch.delenv(check_ahead.ENV_SHAPES, raising=False)
    else:
        monkeypatch.setenv(check_ahead.ENV_SHAPES, raw)
    if mode is None:
        with pytest.raises(EnvironmentProblem, match="GRPO_CONFORM_COMPILE_AHEAD_SHAPES"):
            check_ahead.shapes()
    else:
        assert check_ahead.shapes() == mode


def test_a_slot_worker_that_does_not_load_closes_the_one_spawned_beside_it(monkeypatch):
    """The compile-ahead worker is spawned before the slot's own loads: when that load fails (the
    implementation does not import), the spawned one is closed there and then, never loaded or begun."""
    from test_timed_phase import FakeGate, FakeSession

    from grpo_conform.isolation.session import ImplementationLoadError

    monkeypatch.setenv(check_ahead.ENV, "1")
    gate = FakeGate()

    class Session(FakeSession):
        compile_cache_info = {"reused_files": 0}

        def load(self):
            super().load()
            if FakeSession.made.index(self) == 0:
                raise ImplementationLoadError(ROOT / "implementation.toml", "entry", "cannot load impl:entry")

    result = _slot_check(monkeypatch, gate, Session)
    steps = [(e, k) for e, k, *_ in gate.log if e in ("spawn", "load", "close")]
    assert steps[:4] == [("spawn", "worker0"), ("spawn", "worker1"), ("load", "worker0"), ("close", "worker1")]
    assert ("load", "worker1") not in steps and _Recorder.begun == []
    assert result.status != "conformant"  # the load error is the implementation's verdict, as without it


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), (" 0 ", False)])
def test_on_by_default_and_off_with_zero(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(check_ahead.ENV, raising=False)
    else:
        monkeypatch.setenv(check_ahead.ENV, value)
    assert check_ahead.enabled() is on


def test_a_request_needs_free_device_memory_beside_it(monkeypatch):
    """The gate's grants are estimates (a slot's judge passes them at its peaks): a request also needs what the
    device really has free, HEADROOM beside it."""
    from grpo_conform import device_memory

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(device_memory, "device_free_bytes", lambda device: 10 << 30)
    assert check_ahead.has_room(cuda, (10 << 30) - check_ahead.HEADROOM)
    assert not check_ahead.has_room(cuda, (10 << 30) - check_ahead.HEADROOM + 1)
    assert check_ahead.has_room(torch.device("cpu"), 1 << 50)  # no device memory to ask about


class _Gate:
    """A slot's gate client: refuses the first `try` for memory, then grants; records releases."""

    def __init__(self):
        self.asked: list[int] = []
        self.released: list[int] = []

    def try_memory(self, nbytes):
        self.asked.append(nbytes)
        return 0 if len(self.asked) == 1 else 7

    def release(self, token):
        self.released.append(token)


def test_its_proxies_wait_for_room_on_the_gpu_and_give_it_back(tmp_path, monkeypatch):
    """Beside other slots it sends only when the gate grants the proxies' memory at once (never queued);
    refused, it asks again after the next workload; the hold goes back once the answer is collected."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-is", ("small-bf16",)), ("token-offpolicy-mask", ("mask-small-bf16",)))
    gate = _Gate()
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0, gate)
    try:
        ahead.step(0)
        assert ahead.sent == [] and ahead.pending is None and gate.asked[0] > 0  # refused: nothing sent
        ahead.step(0)
        assert ahead.sent == ["token-offpolicy-mask"] and gate.released == []
        _wait(ahead)
        ahead.step(0)
        assert gate.released == [7] and ahead.session is None
    finally:
        ahead.close()
    assert gate.released == [7]  # once


def test_let_go_waits_for_the_answer_and_gives_the_memory_back(tmp_path, monkeypatch):
    """Before its slot waits in the gate's queue, the request in flight is collected (waited for, unlike `step`)
    and its hold released; the next request goes only at the next step."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-is", ("small-bf16",)), ("token-offpolicy-mask", ("mask-small-bf16",)))
    gate = _Gate()
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0, gate)
    try:
        ahead.let_go()  # nothing in flight: nothing to do
        assert gate.released == [] and ahead.session is not None
        ahead.step(0)  # refused
        ahead.step(0)
        assert ahead.pending is not None and gate.released == []
        ahead.let_go()  # no _wait first: it waits itself
        assert gate.released == [7] and ahead.pending is None and ahead.held_bytes == 0
        assert len(gate.asked) == 2  # nothing sent again until the next step
    finally:
        ahead.close()
    assert gate.released == [7]


def test_workloads_that_differ_only_in_batch_are_one_proxy(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-offpolicy-mask", ("mask-small-bf16",)),
                       ("token-is", ("small-bf16", "odd-vocab")))
    small = members[1].spec.workload("small-bf16")
    twin = small.model_copy(update={"name": "small-b3", "axes": {**small.axes, "batch": 3}})
    members[1] = MemberPlan(members[1].spec, members[1].workloads + (twin,))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        ahead.step(0)
        assert ahead.pending == ["A0", "A1"]  # small-bf16 and its batch-3 twin: one proxy; odd-vocab the other
    finally:
        ahead.close()


def test_the_current_member_s_later_workloads_go_at_once(tmp_path, monkeypatch):
    """The slot's first member: its workloads after the first are compiled while the slot runs the first (a
    mask-b8's kernels while its mask-small-bf16 is judged); the first one's own shape is not sent."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-offpolicy-mask", ("mask-small-bf16", "mask-b1-long")))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0)
    try:
        assert ahead.sent == ["token-offpolicy-mask"] and ahead.pending == ["A0"]  # before any step
        store = ahead.session._cache_store
        _wait(ahead)
        ahead.step(0)  # collected; no member after it: closed
        assert ahead.session is None
        assert sorted({p.name.split("-")[1] for p in (store / ".triton").iterdir()}) == ["v256"]
    finally:
        ahead.close()
    assert not check_ahead.AheadCompiler.wanted(_members(("token-is", ("small-bf16",))), 0)  # nothing ahead


def test_a_member_not_yet_begun_also_gets_its_once_per_member_calls(tmp_path, monkeypatch):
    """reach's and other-dtypes' calls (checks/member_calls.py) join the next member's request at their own shapes
    and dtypes where kernels compile at first launch (CUDA; forced here), so their kernels reach the store before
    that member's first workload calls them. The first member's are not sent: they run in its first workload."""
    from grpo_conform.checks import member_calls

    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-offpolicy-mask", ("mask-small-bf16", "mask-b1-long")),
                       ("bnpo-mask", ("mask-small-bf16",)))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0,
                                            once_calls=True)
    try:
        assert ahead.pending == ["A0"]  # the first member: its later workload only
        _wait(ahead)
        ahead.step(0)  # collected, then bnpo-mask's workload at batch 1
        assert ahead.pending == ["A0"] and [q[3] for q in ahead.queue] == [True]
        _wait(ahead)
        ahead.step(0)  # then, in a request of their own, its planned calls
        spec = members[1].spec
        reach = member_calls.reach_calls(spec, "cpu", "bfloat16")
        others = member_calls.other_dtype_workloads(spec, "cpu")
        every = ["bfloat16", "float16", "float32"]  # the low and vocabulary-blocks calls: each declared dtype
        turn = member_calls.member_turn(spec)  # the free-axis calls' dtypes start at the member's turn
        free = [["float16", "float32", "bfloat16"][(i + (0 if i == 1 else turn)) % 3] for i in range(3)]
        assert [c.dtype for c in reach] == free + ["bfloat16", "bfloat16"] + every * 2 + [
            "bfloat16"]  # and the seq-aligned call
        assert len(others) == 2
        assert ahead.pending == [f"A{i}" for i in range(len(reach) + len(others))]
        shapes = [tuple(s.tensors["logits"].shape) for s in ahead.held]
        dtypes = [s.tensors["logits"].dtype for s in ahead.held]
        want = [spec.resolve(w).shapes["logits"] for w in member_calls.planned_workloads(spec, "cpu",
                                                                                          members[1].workloads[0])]
        assert shapes == [tuple(x) for x in want]  # reach's calls, then other-dtypes', as they will run
        every = [torch.bfloat16, torch.float16, torch.float32]  # the low and blocks calls: each declared dtype
        assert dtypes == ([getattr(torch, d) for d in free] + [torch.bfloat16] * 2 + every * 2 + [torch.bfloat16]
                          + [torch.float16, torch.float32])
        _wait(ahead)
        store = ahead.session._cache_store
        ahead.step(0)
        vocab = {int(p.name.split("-")[1][1:]) for p in (store / ".triton").iterdir()}
        assert {c.axes["vocab"] for c in reach} <= vocab  # compiled (here: a folder a call) before bnpo-mask begins
    finally:
        ahead.close()


def test_reach_and_other_dtypes_call_what_was_planned_but_one_call_nobody_was_shown():
    """In the process that planned them (the slot's): reach's calls are member_calls.reach_calls but one, and
    other-dtypes' passes member_calls.other_dtype_workloads but one, each drawn from the workload's seeds when the
    probe ran. A kernel right only at the shapes compile-ahead showed it is wrong at that call."""
    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.checks import member_calls

    report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                                    members=("bnpo-mask",), workloads=("mask-small-bf16",),
                                    checks=("reach", "exact-ties")))
    (w,) = report.implementations[0].workloads
    spec = report.implementations[0].members[0].spec
    planned = [(c.axes, c.dtype) for c in member_calls.reach_calls(spec, "cpu", "bfloat16")]
    used = [(d["axes"], d["dtype"]) for d in w.draws["reach"]]
    differ = [i for i, (a, b) in enumerate(zip(planned, used)) if a != b]
    # one shape redrawn: one call, or the one lead's calls in each declared dtype (low, vocab-blocks)
    assert len({w.draws["reach"][i]["lead"] for i in differ}) == 1 and len(differ) in (1, 3)
    assert all(used[i][1] == planned[i][1] for i in differ)  # the same dtype, another shape
    assert [d["announced"] for d in w.draws["reach"]] == [i not in differ for i in range(len(used))]
    shown = dict(member_calls.other_dtype_workloads(spec, "cpu"))
    passes = w.draws["other_dtypes"]
    assert set(passes) == set(shown) == {"float16", "float32"}
    hidden = [d for d, p in passes.items() if not p["announced"]]
    assert len(hidden) == 1
    for d, p in passes.items():
        axes = {a: p["axes"][a] for a in shown[d].axes}  # the draws hold the resolved axes (seq_next too)
        assert (axes == shown[d].axes) == p["announced"], (d, axes, shown[d].axes)


def test_the_unannounced_reach_call_is_never_the_announced_shape():
    """Reach's lead axis takes one of four values: a redraw may equal the announced shape, and is drawn again. One
    shape is redrawn: one call, or the blocks calls, one shape made in each declared dtype (the low calls draw one
    shape each, and only the first is the lead's)."""
    import random

    from grpo_conform.checks import member_calls
    from grpo_conform.spec import find_spec

    spec = find_spec("grpo/sapo-mask")
    shown = member_calls.reach_calls(spec, "cuda", "bfloat16")
    for seed in range(200):
        used = member_calls.reach_calls(spec, "cuda", "bfloat16", random.Random(seed))
        changed = [b for a, b in zip(shown, used) if a != b]
        assert len({c.lead for c in changed}) == 1
        assert len(changed) == (3 if changed[0].lead == member_calls.BLOCKS else 1)  # low: one shape each dtype


def test_once_calls_of_a_member_already_begun_are_dropped(tmp_path, monkeypatch):
    """Its workloads' request still goes (its later workloads gain); its once-per-member calls do not: they ran in
    its first workload."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    members = _members(("token-is", ("small-bf16",)), ("bnpo-mask", ("mask-small-bf16", "mask-b1-long")))
    ahead = check_ahead.AheadCompiler.begin(check_ahead.AheadCompiler.spawn(lambda: _session(tmp_path)), members, 0,
                                            once_calls=True)
    try:
        ahead.step(0)  # bnpo-mask's workloads sent, its once-per-member calls queued
        assert ahead.pending == ["A0", "A1"] and [q[3] for q in ahead.queue] == [True]
        _wait(ahead)
        ahead.step(1)  # the slot began bnpo-mask meanwhile
        assert ahead.queue == [] and ahead.session is None
    finally:
        ahead.close()


@pytest.mark.parametrize("raw, device, on", [("", "cuda", True), ("", "cpu", False), ("0", "cuda", False),
                                             ("1", "cpu", True)])
def test_once_calls_follow_the_device_and_the_switch(monkeypatch, raw, device, on):
    monkeypatch.setenv(check_ahead.ENV_ONCE, raw)
    assert check_ahead.once_calls_enabled(torch.device(device)) is on


def test_a_bad_once_switch_is_refused_by_name(monkeypatch):
    from grpo_conform.errors import EnvironmentProblem

    monkeypatch.setenv(check_ahead.ENV_ONCE, "yes")
    with pytest.raises(EnvironmentProblem, match="GRPO_CONFORM_COMPILE_AHEAD_ONCE"):
        check_ahead.once_calls_enabled(torch.device("cuda"))


CHEAT = '''

import json as _json
import os as _os

# the calls compile-ahead was shown, as files its worker left in the shared compile store would hand them on
_SHOWN = {tuple(s) for s in _json.load(open(_os.path.join(_os.path.dirname(__file__), "announced.json")))}


def grpo_loss(logits, completion_ids, advantages, **kw):
    """Right wherever it was shown the shape ahead, 5% off at any other shape past the default workloads'."""
    loss = _honest_grpo_loss(logits, completion_ids, advantages, **kw)
    b, s, v = logits.shape
    if (v > 100000 or b > 40 or s >= 512 or v % 4096 == 0 or v < 32) and (b, s, v) not in _SHOWN:  # every reach call
        return loss * 1.05
    return loss
'''


def test_a_kernel_right_only_where_compile_ahead_showed_it_fails_reach(tmp_path, monkeypatch):
    """The hostile case of announcing reach's shapes: an implementation that learns them from its compile-ahead
    worker (here: a file naming them) and is right only there. Reach's one unannounced call catches it; with every
    call announced (reach_calls without the workload's generator, the first form of this change) it passes."""
    import json

    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.checks import member_calls
    from grpo_conform.spec import find_spec

    folder = tmp_path / "right-where-shown"
    folder.mkdir()
    honest = (ROOT / "implementations" / "pytorch" / "impl.py").read_text()
    (folder / "impl.py").write_text(honest.replace("def grpo_loss(", "def _honest_grpo_loss(") + CHEAT)
    (folder / "implementation.toml").write_text(
        'name = "right-where-shown"\nspec = "grpo"\nmembers = ["bnpo-mask"]\nentry = "impl:grpo_loss"\n'
        'language = "python"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "right only at announced shapes"\n')
    spec = find_spec("grpo/bnpo-mask")
    first = spec.workload("mask-small-bf16")
    shown = [list(spec.resolve(first.model_copy(update={"axes": c.axes})).shapes["logits"])
             for c in member_calls.reach_calls(spec, "cpu", "bfloat16")]  # the logits' shapes, seq_next rows each
    (folder / "announced.json").write_text(json.dumps(shown))

    def reach_status():
        report = run_check(CheckRequest((str(folder),), device="cpu", workloads=("mask-small-bf16",),
                                        checks=("reach",)))
        (w,) = report.implementations[0].workloads
        return next(o.status for o in w.outcomes if o.check == "reach")

    assert reach_status() == "fail"
    every_call_shown = member_calls.reach_calls
    monkeypatch.setattr(member_calls, "reach_calls",
                        lambda spec, device_type, own_dtype, fresh=None: every_call_shown(spec, device_type, own_dtype))
    assert reach_status() == "pass"  # the hole the unannounced call closes
