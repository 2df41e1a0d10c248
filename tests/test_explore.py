"""`check --explore N`: the explored domain, the parsing of the option, and a search that finds and
shrinks a kernel wrong only where no workload draws (and passes an honest one)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_conform.ops.grpo_logits.explore import case_inputs, explore, parameter_bounds
from grpo_conform.implementations import load_implementation
from grpo_conform.isolation.session import WorkerSession
from grpo_conform.spec import load_family, load_spec

FAMILY = "specs/grpo.v1.json"
CATCHES = Path(__file__).resolve().parent / "data" / "explore" / "temperature-floor"


def _bounds(member: str) -> dict:
    spec = load_family(FAMILY).member(member)
    return {p.name: parameter_bounds(spec, p) for p in spec.parameters}


def test_explored_domain_keeps_closed_ends_approaches_open_ones_and_widens_infinite_ones():
    token = _bounds("token-is")
    assert token["epsilon_low"] == pytest.approx((0.0, 1 - 0.7 / 4))  # [0, 1): 0 itself, 1 approached
    assert token["epsilon_high"] == pytest.approx((0.0, 4 * 0.35))  # [0, inf)
    assert token["temperature"] == pytest.approx((0.45 / 4, 4 * 2.2))  # (0, inf): beyond every workload draw
    assert _bounds("token-offpolicy-mask-delta")["delta"] == pytest.approx((1 + 0.3 / 4, 8.0))
    assert _bounds("dapo-global-mask")["num_items_in_batch"] == pytest.approx((1, 4 * 65536))
    assert _bounds("token-offpolicy-mask")["loss_type"] is None  # a choice: its declared values
    seed_file = load_spec("specs/grpo-token-is.v1.json")  # declares no domains: its built-in draw ranges
    assert {p.name: parameter_bounds(seed_file, p) for p in seed_file.parameters}["temperature"] == (0.45, 2.2)


def test_case_inputs_are_the_generator_s_with_the_drawn_advantages():
    spec = load_family(FAMILY).member("token-offpolicy-mask")
    case = {"axes": {"batch": 2, "seq": 3, "vocab": 5}, "dtypes": {"logits": "float32"},
            "values": {p.name: p.value for p in spec.parameters}, "seed": 4, "advantages": [0.5, -1e-6]}
    a, b = case_inputs(spec, case), case_inputs(spec, case)
    assert a["logits"].shape == (2, 4, 5) and a["logits"].dtype == torch.float32
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["advantages"].tolist() == pytest.approx([0.5, -1e-6])


def test_the_option_is_parsed_into_the_request(monkeypatch):
    from click.testing import CliRunner

    import grpo_conform.check as check_module
    from grpo_conform.cli import main
    from grpo_conform.errors import EnvironmentProblem

    seen = []

    def fake_run_check(request, progress=None):
        seen.append(request)
        raise EnvironmentProblem("stopped by the test")

    monkeypatch.setattr(check_module, "run_check", fake_run_check)
    result = CliRunner().invoke(main, ["check", "implementations/pytorch", "--explore", "7", "--no-evidence"])
    assert seen and seen[0].explore == 7, result.output
    assert CliRunner().invoke(main, ["check", "implementations/pytorch", "--explore", "-1"]).exit_code == 2


def test_cli_prints_only_the_snippets_of_failed_explorations():
    from grpo_conform.cli import _explore_snippets

    def w(name, draws):
        return SimpleNamespace(workload=name, draws=draws)

    report = SimpleNamespace(implementations=[SimpleNamespace(workloads=[
        w("odd-vocab", {}), w("explore", {"explore": {"snippet": None}}), w("explore", {"explore": {"snippet": "x"}})])])
    assert _explore_snippets(report) == ["x"]


def _session(folder, spec) -> WorkerSession:
    s = WorkerSession(load_implementation(folder), spec.parameter_values, torch.device("cpu"), 120, True)
    s.start()
    return s


@pytest.mark.slow
def test_explore_finds_shrinks_and_reproduces_a_corner_no_workload_draws():
    """The kernel clamps the temperature at 0.4 (the workloads draw 0.45 to 2.2). Seeded, so the
    test is deterministic; ~10 cases. The snippet, run here, shows the wrong gradient."""
    spec = load_family(FAMILY).member("token-is")
    impl = load_implementation(CATCHES)
    session = _session(CATCHES, spec)
    try:
        result = explore(session, spec, 10, seed=1, impl=impl)
    finally:
        session.close()
    assert result.failed == ("gradient",)
    case = result.case
    assert case["values"]["temperature"] < 0.4
    assert case["axes"] == {"batch": 1, "seq": 1, "vocab": case["axes"]["vocab"]} and case["axes"]["vocab"] <= 8
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(result.snippet, "<explore snippet>", "exec"), {})
    gap, scale = map(float, re.search(r"reference\| ([\d.e+-]+), max \|reference\| ([\d.e+-]+)", printed.getvalue()).groups())
    assert gap > 0.1 * scale, printed.getvalue()


@pytest.mark.slow
def test_explore_passes_an_honest_implementation():
    spec = load_family(FAMILY).member("token-offpolicy-mask-kl")
    session = _session("implementations/pytorch", spec)
    try:
        result = explore(session, spec, 12, seed=3)
    finally:
        session.close()
    assert result.case is None and result.examples == 12 and 1 <= result.evaluations <= 12  # repeats run once


@pytest.mark.slow
def test_a_worker_lost_during_exploration_ends_it_with_that_case_and_runs_failed():
    """No shrinking on a dead worker: the case that lost it is the result, `runs` alone fails."""
    spec = load_family(FAMILY).member("token-is")
    folder = Path(__file__).resolve().parent / "gallery" / "kills-itself"
    session = _session(folder, spec)
    try:
        result = explore(session, spec, 5, seed=5)
    finally:
        session.close()
    assert result.failed == ("runs",) and result.evaluations == 1 and result.case is not None
