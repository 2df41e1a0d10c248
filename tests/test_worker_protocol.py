"""The worker protocol: the table in docs/architecture.md ("Worker protocol") against the worker's
dispatch table, the reply models and the ops the parent's code sends (so the doc cannot drift and
the worker offers nothing no parent sends); an unknown op refused; gradients generic (several
differentiable inputs, each exported by name and each held to the contract: shape, dtype, device,
no storage shared with an input or with another gradient)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SPEC_FILE
from grpo_conform.checks.buffers import OutputSlot, only_gradient, overlap_text, storage_overlaps
from grpo_conform.checks.judging import gradient_contract
from grpo_conform.compare import GradientComparator, GradientComparisons
from grpo_conform.implementations import MANIFEST, load_implementation
from grpo_conform.isolation import messages, worker
from grpo_conform.isolation.session import WorkerFailure, WorkerSession
from grpo_conform.spec import load_spec

PACKAGE = ROOT / "grpo_conform"
SENT = re.compile(r"""(?:\bop=|["']op["']\s*:\s*)["']([a-z_]+)["']""")


def _table() -> dict[str, dict[str, str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Worker protocol\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    out = {}
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, line
        out[cells[0].strip("`")] = {"arguments": cells[1], "reply": cells[2], "sent_by": cells[3]}
    return out


def _sent() -> dict[str, set[str]]:
    """op -> the files under grpo_conform/ (the worker's own aside) whose code sends it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "worker.py" and path.parent.name == "isolation":
            continue
        for op in SENT.findall(path.read_text()):
            found.setdefault(op, set()).add(str(path.relative_to(PACKAGE)))
    return found


def test_the_protocol_table_is_the_worker_s_dispatch_table_and_what_the_parent_sends():
    table, sent = _table(), _sent()
    assert set(table) == set(worker.OPS) | {"exit"}, "docs/architecture.md's table and worker.OPS differ"
    assert set(worker.OPS) == set(messages.REPLIES), "every op the worker serves has a reply model, no other"
    assert set(sent) == set(table), f"ops the parent sends {sorted(sent)} vs the table {sorted(table)}"
    for op, row in table.items():
        named = set(re.findall(r"`([a-z_/]+\.py)`", row["sent_by"]))
        assert named and named <= sent[op], f"{op}: the table says sent by {sorted(named)}, the code by {sorted(sent[op])}"


def test_the_worker_dispatches_only_its_table():
    for dead in ("call", "continue", "reread", "release", "kept"):
        assert dead not in worker.OPS and not hasattr(worker._Worker, f"op_{dead}")


# -- a worker with two differentiable inputs -------------------------------------------------------------

TWO = '''\
import torch


class Product(torch.autograd.Function):
    """loss = sum(a * b); `mode` says what backward hands autograd as the two gradients."""

    @staticmethod
    def forward(ctx, a, b, mode):
        ctx.save_for_backward(a, b)
        ctx.mode = mode
        return (a * b).sum()

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        if ctx.mode == "honest":
            return g * b, g * a, None
        if ctx.mode == "one-buffer":  # one tensor handed out as both gradients
            shared = g * (a + b)
            return shared, shared, None
        if ctx.mode == "input-as-gradient":  # b's gradient is input a's own memory
            return g * b, a.detach(), None
        raise ValueError(ctx.mode)


def two_inputs(a, b, mode):
    return Product.apply(a, b, mode)
'''


@pytest.fixture(scope="module")
def two_gradient_worker(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two") / "two-gradients"
    folder.mkdir()
    (folder / MANIFEST).write_text('name = "two-gradients"\nspec = "grpo-token-is"\nentry = "impl:two_inputs"\n'
                                   'language = "python"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "x"\n')
    (folder / "impl.py").write_text(TWO)
    with WorkerSession(load_implementation(folder), {}, torch.device("cpu"), 120.0) as session:
        g = torch.Generator().manual_seed(0)
        descriptors, shared = {}, {}
        for name in ("a", "b"):
            shared[name], descriptors[name] = session.allocator.share(torch.randn(3, 4, generator=g))
        session.bind("in", descriptors)
        out = OutputSlot.create(session, "out", {"a": ((3, 4), torch.float32), "b": ((3, 4), torch.float32)})
        yield session, shared, out


def _call(session, out, mode: str, method: str = "autograd.grad") -> dict:
    session.request(op="forward", call=mode, inputs="in", params={"mode": mode}, grad=True, gradients=["a", "b"])
    session.request(op="backward", calls=[mode], upstream=[1.0], method=method)
    out.clear()
    return session.request(op="export", call=mode, outputs=out.name, keep=False)["report"]


@pytest.mark.parametrize("method", ["backward", "autograd.grad"])
def test_every_differentiable_input_gets_its_gradient_by_name(two_gradient_worker, method):
    session, shared, out = two_gradient_worker
    report = _call(session, out, "honest", method)
    assert set(report["grads"]) == {"a", "b"}
    assert torch.equal(out.grads["a"], shared["b"]) and torch.equal(out.grads["b"], shared["a"])
    for name in ("a", "b"):
        assert gradient_contract(name, report["grads"][name], shared[name], "cpu", several=True) == []
    assert storage_overlaps(report["storage"], ["a", "b"], ["a", "b"]) == []


def test_one_buffer_handed_out_as_two_gradients_is_aliasing(two_gradient_worker):
    session, _, out = two_gradient_worker
    report = _call(session, out, "one-buffer")
    found = storage_overlaps(report["storage"], ["a", "b"], ["a", "b"])
    assert [overlap_text(o) for o in found] == ["grad:a shares storage with grad:b"]


def test_a_gradient_that_is_an_input_s_memory_is_aliasing(two_gradient_worker):
    session, _, out = two_gradient_worker
    report = _call(session, out, "input-as-gradient")
    found = storage_overlaps(report["storage"], ["a", "b"], ["a", "b"])
    assert [overlap_text(o) for o in found] == ["grad:b shares storage with input a"]


def test_an_operation_the_parent_never_sends_is_refused(two_gradient_worker):
    session = two_gradient_worker[0]
    for op in ("call", "reread", "release", "kept", "op_load", "__init__"):
        with pytest.raises(WorkerFailure, match=f"the worker has no operation '{op}'; it accepts backward, bind"):
            session.request(op=op, keep="A", outputs="out")
    assert session.alive  # refused, not crashed: the next op is served
    session.request(op="drop")


def test_the_memory_peak_is_none_without_cuda_and_the_worker_serves_on(two_gradient_worker):
    """`memory_peak` (check._memory_hold's reading beside a grant): nothing to say on the CPU, and the
    worker goes on serving."""
    from grpo_conform import check  # (the parent's side of the op: only this test needs it)

    session = two_gradient_worker[0]
    assert session.request(op="memory_peak")["reserved_peak"] is None
    assert check._worker_peak(session) is None and check._worker_peak(None) is None
    session.request(op="drop")


# -- the per-gradient contract and comparison (no worker) ------------------------------------------------

def test_the_gradient_contract_names_each_gradient_and_what_is_wrong():
    x = torch.zeros(3, 4, dtype=torch.bfloat16)
    good = {"type": "torch.Tensor", "exact_tensor": True, "dtype": "bfloat16", "shape": [3, 4], "device": "cpu"}
    assert gradient_contract("weight", good, x, "cpu", several=True) == []
    assert gradient_contract("weight", None, x, "cpu", several=True) == ["backward left no gradient on weight"]
    assert gradient_contract("weight", None, x, "cpu", several=True, skipped=True) == []  # reported once, as skipped
    bad = dict(good, dtype="float32", shape=[4, 3], device="meta", exact_tensor=False, type="my.Lazy")
    assert gradient_contract("weight", bad, x, "cpu", several=True) == [
        "the gradient of weight is a my.Lazy, not exactly torch.Tensor",
        "gradient of weight dtype float32, expected bfloat16 (the weight dtype)",
        "gradient of weight shape [4, 3], expected [3, 4]",
        "gradient of weight on meta, expected cpu"]
    # one gradient (GRPO over logits): the texts records have always carried
    assert gradient_contract("logits", dict(good, dtype="float32"), x, "cpu", several=False) == [
        "gradient dtype float32, expected bfloat16 (the logits dtype)"]


def _compared(actual: torch.Tensor, expected: torch.Tensor) -> GradientComparator:
    tol = load_spec(SPEC_FILE).tolerance("float32").gradient
    cmp = GradientComparator(tol, seq_next=actual.shape[0] + 1, width=actual.shape[1])  # no row is the last
    cmp.update(0, actual, expected, expected.abs().amax(dim=1))
    return cmp


def test_each_gradient_is_compared_by_name_and_a_failure_names_it():
    g = torch.Generator().manual_seed(1)
    ref_w, ref_h = torch.randn(4, 6, generator=g), torch.randn(2, 6, generator=g)
    right = GradientComparisons({"weight": _compared(ref_w.clone(), ref_w), "hidden": _compared(ref_h.clone(), ref_h)})
    assert right.passed and right.nan == 0
    # hidden's gradient right, weight's left at zero (a stale or never-written second gradient)
    stale = GradientComparisons({"hidden": _compared(ref_h.clone(), ref_h),
                                 "weight": _compared(torch.zeros_like(ref_w), ref_w)})
    assert not stale.passed and stale.failed == ["weight"]
    assert stale.describe().startswith("gradient of weight: 24/24 elements outside tolerance")
    assert "hidden" not in stale.describe()
    assert set(stale.evidence()["gradients"]) == {"hidden", "weight"}
    # one gradient: its comparator's own text and evidence, as before gradients had names
    only = GradientComparisons({"logits": _compared(torch.zeros_like(ref_w), ref_w)})
    assert only.describe() == only["logits"].describe() and only.evidence() == only["logits"].evidence()


def test_today_s_reference_is_compared_under_the_spec_s_one_gradient_and_refuses_several():
    spec = load_spec(SPEC_FILE)
    assert only_gradient(spec) == "logits"
    (g,) = spec.gradients
    two = spec.model_copy(update={"gradients": (g, g.model_copy(update={"input": "advantages"}))})
    with pytest.raises(ValueError, match=r"lists 2 gradients \(logits, advantages\).*reference per gradient"):
        only_gradient(two)


# -- memory the parent shares: released when a slot is unbound ------------------------------------------

def test_unbind_collects_garbage_and_names_storages_still_held():
    """CUDA IPC buffers are the parent's, freed only when the worker lets go (round30a on the H200: the
    parent reached 122 GiB at the tenth member). Unbinding collects the worker's cyclic garbage (a graph
    kept alive by a cycle is the common case) and names what is still held by a live reference."""
    w = worker._Worker.__new__(worker._Worker)
    replies = []
    w.send = lambda **msg: replies.append(msg)
    w.device = "cuda"  # the check runs where storages are IPC-shared; CPU tensors stand in for them here
    logits, ids, other = torch.zeros(1000), torch.zeros(10, dtype=torch.long), torch.zeros(3)
    w.slots = {"P": {"logits": logits, "ids": ids}, "Q": {"x": other}}

    class Node:
        pass

    cycle = Node()
    cycle.self, cycle.tensor = cycle, logits  # garbage once the names below are gone, freed only by gc
    kept = ids  # what an implementation's cache would do
    del cycle, logits, ids, other
    w.op_unbind(slots=["P"])
    assert replies[-1] == {"status": "ok", "held": ["P.ids"]}
    assert set(w.slots) == {"Q"} and kept is not None
    w.op_unbind(slots=["Q"])
    assert replies[-1]["held"] == []
    assert messages.REPLIES["unbind"].model_validate(replies[-1])  # the parent's strict model accepts it


def test_a_view_slot_sends_one_descriptor_per_buffer(monkeypatch):
    """Each CUDA descriptor made is a reference torch waits for the worker to release: the view slot
    (the layouts probe) must not describe the base buffer as well as the view it sends."""
    from grpo_conform.checks import buffers

    made, flags = [], []

    class Allocator:
        def empty(self, shape, dtype, describe=True):
            flags.append(describe)
            return torch.zeros(shape, dtype=dtype), ({"kind": "cuda_ipc"} if not describe else {"kind": "cuda_ipc", "x": 1})

    class Session:
        allocator = Allocator()

        def bind(self, name, descs):
            self.bound = descs

    monkeypatch.setattr(buffers, "cuda_descriptor", lambda t: made.append(t) or {"kind": "cuda_ipc", "view": True})
    import random

    session = Session()
    slot = buffers.InputSlot.create_views(session, "V", {"logits": (2, 3, 5), "ids": (2, 2)},
                                          {"logits": torch.bfloat16, "ids": torch.long}, random.Random(1))
    assert flags == [False, False] and len(made) == 2  # one descriptor each: the views'
    assert set(session.bound) == {"logits", "ids"} and slot.tensors["logits"].shape == (2, 3, 5)


def test_a_plain_call_is_two_round_trips(monkeypatch):
    """forward, then backward and export in one request (a worker request costs ~10 ms on the H200's host):
    the plain calls of the gradient probes send no `export` of their own, and their verdicts stand."""
    from grpo_conform.check import CheckRequest, run_check

    ops = []
    request = WorkerSession.request
    monkeypatch.setattr(WorkerSession, "request",
                        lambda self, timeout=None, **msg: ops.append((msg.get("op"), "export" in msg)) or
                        request(self, timeout, **msg))
    report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu", members=("token-is",),
                                    workloads=("small-bf16",), checks=("gradient",), jobs=1))
    outcomes = {o.check: o.status for w in report.implementations[0].members[0].workloads for o in w.outcomes}
    assert outcomes["gradient"] == "pass"
    forwards = sum(1 for op, _ in ops if op == "forward")
    assert forwards >= 3 and ("export", False) not in ops
    assert sum(1 for op, merged in ops if op == "backward" and merged) == forwards


def test_the_worker_waits_for_its_writes_before_it_answers_a_rewrite_or_an_error(monkeypatch):
    """On CUDA the worker's writes into shared buffers are asynchronous. A rewrite's copies (probe rewritten-inputs)
    and whatever a call launched before raising must land before the worker answers: the parent then writes the
    same buffers again on its own stream (an H100 run failed no-mutation on two members' RW calls, "logits changed
    during forward", a late rewrite overwriting the parent's restore). Here the synchronisation is counted."""
    from types import SimpleNamespace

    synced, sent = [], []
    w = SimpleNamespace(calls={"RW": {"handed": {"advantages": torch.zeros(3)}}},
                        slots={"Q": {"advantages": torch.ones(3)}},
                        _sync=lambda phase: synced.append(phase), send=lambda **m: sent.append(m))
    worker._Worker.op_rewrite(w, call="RW", source="Q", names=["advantages"])
    assert synced == ["rewrite"] and sent == [{"status": "ok"}]
    assert torch.equal(w.calls["RW"]["handed"]["advantages"], torch.ones(3))

    messages_in = iter([{"op": "backward"}, {"op": "exit"}])

    def failing(self, **_):
        raise worker._CallError({"message": "boom", "phase": "backward"})

    monkeypatch.setitem(worker.OPS, "backward", failing)
    w2 = SimpleNamespace(recv=lambda: next(messages_in), _sync=lambda phase: synced.append(phase),
                         send=lambda **m: sent.append(m))
    worker._Worker.serve(w2)
    assert synced[-1] == "backward" and sent[-1]["status"] == "error"
