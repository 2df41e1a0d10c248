"""The `backward` timed protocol as the seed benchmark ran it (issue 31 item 5), on the CPU: the worker's
`TimedSteps` (isolation/worker.py) prepares one forward and one backward with retain_graph=True, sets
the first input's .grad to None (do_bench's grad_to_none=[_input]), and times a second
backward(retain_graph=True) that accumulates into weight.grad; the re-checked gradients are what that
backward added. The CUDA events around it are the same as every protocol's (tests/test_triton_cuda.py
and the H200 runs); records and the leaderboard label it backward-only and never rank it."""

from __future__ import annotations

import torch

from grpo_conform.isolation.worker import TimedSteps
from grpo_conform.report.model import PROTOCOL_ORDER, UNRANKED


def _guarded(phase, fn):
    return fn()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"hidden": torch.randn(2, 5, 16, generator=g).bfloat16(), "weight": (torch.randn(37, 16, generator=g) / 4).bfloat16(),
            "ids": torch.randint(0, 37, (2, 5), generator=g), "adv": torch.randn(2, generator=g)}


def _eager(hidden, weight, ids, adv):
    logp = torch.log_softmax(torch.nn.functional.linear(hidden, weight).float(), -1)
    logp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (-(torch.exp(logp - logp.detach()) * adv.unsqueeze(-1))).mean(-1).mean()


class _SavedInForward(torch.autograd.Function):
    """Liger's shape of the work: every gradient computed in forward; backward only scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, adv):
        with torch.enable_grad():
            h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)
            loss = _eager(h, w, ids, adv)
            ctx.grads = torch.autograd.grad(loss, (h, w))
        return loss.detach()

    @staticmethod
    def backward(ctx, g):
        return ctx.grads[0] * g, ctx.grads[1] * g, None, None


def _steps(protocol, fn, x):
    leaves = {n: x[n].detach().clone().requires_grad_(True) for n in ("hidden", "weight")}
    return TimedSteps(protocol, lambda: fn(leaves["hidden"], leaves["weight"], x["ids"], x["adv"]), leaves, 1.0,
                      _guarded), leaves


def test_backward_prepares_a_warm_weight_grad_and_times_an_accumulating_retained_backward():
    x = _inputs()
    full, _ = _steps("full", _eager, x)
    full.prepare()
    full.timed()
    expected = {n: g.clone() for n, g in full.gradients().items()}
    for fn in (_eager, _SavedInForward.apply):
        step, leaves = _steps("backward", fn, x)
        step.prepare()  # the untimed forward and first backward
        assert leaves["hidden"].grad is None and leaves["weight"].grad is not None  # grad_to_none=[_input]
        warm = leaves["weight"].grad.clone()
        step.timed()  # the timed part: backward(retain_graph=True) through the same graph
        assert torch.equal(leaves["weight"].grad, warm + warm)  # accumulated, as the benchmark's repetitions
        got = step.gradients()
        for name in ("hidden", "weight"):
            assert torch.equal(got[name], expected[name]), (fn, name)
        step.timed()  # the graph was retained: a further repetition runs
        assert torch.equal(leaves["weight"].grad, 3 * warm)


def test_the_other_protocols_prepare_nothing_and_forward_has_no_gradient():
    x = _inputs(1)
    for protocol in ("forward", "full", "full-scaled"):
        step, leaves = _steps(protocol, _eager, x)
        step.prepare()
        assert step.loss is None and all(leaf.grad is None for leaf in leaves.values())
        step.timed()
        assert step.loss is not None
        assert (step.gradients() == {}) == (protocol == "forward")


def test_backward_only_is_labelled_and_never_ranked():
    assert "backward" in UNRANKED and PROTOCOL_ORDER[-1] == "backward"
    try:
        TimedSteps("backward-ish", lambda: None, {}, 1.0, _guarded)
    except ValueError as exc:
        assert "backward-ish" in str(exc)
    else:
        raise AssertionError("an unknown protocol must be refused")
