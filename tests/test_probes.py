"""The probe registry, the parameter draws and the inputs that issue 10's classes rely on."""

from __future__ import annotations

import random

import torch

from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.checks.model import ReferenceModel, draw_values
from grpo_conform.checks.probes import PROBES_BY_NAME, PROFILES, select
from grpo_conform.ops.fused_linear.probes import FUSED_PROBES
from grpo_conform.ops.fused_linear.value_probes import VALUE_PROBES
from grpo_conform.checks.registry import CHECKS_BY_NAME, CONFORMANCE_CHECKS
from grpo_conform.compare import fp32_floor
from grpo_conform.spec import find_spec, load_spec
from grpo_conform.spec.draws import BUILTIN_DRAWS

SEED_FILE = "specs/grpo-token-is.v1.json"


def test_probes_feed_registered_checks_and_profiles_name_probes():
    for probe in PROBES_BY_NAME.values():
        assert probe.summary, probe.name
        assert set(probe.feeds) <= set(CONFORMANCE_CHECKS), probe.name
        assert set(probe.own) <= set(probe.feeds), probe.name
    for name, probes in PROFILES.items():
        assert set(probes) <= set(PROBES_BY_NAME), name
        for i, probe in enumerate(probes):  # what a probe needs runs before it, in every profile holding it
            assert set(PROBES_BY_NAME[probe].needs) <= set(probes[:i]), (name, probe)
    # C's outputs are read from its output slot: nothing may export into it in between
    full = PROFILES["full"]
    assert full.index("advantage-sign") == full.index("negated-advantages") + 1
    assert {c for n in full for c in PROBES_BY_NAME[n].feeds} == set(CONFORMANCE_CHECKS)
    fed = {c for p in PROBES_BY_NAME.values() for c in p.feeds}
    for check in ("upstream-gradient", "non-leaf-logits", "interleaved-graphs", "input-layouts", "forward-only"):
        assert check in CHECKS_BY_NAME and check in fed


def test_builtin_draws_keep_temperature_away_from_one_and_inside_ranges():
    spec = load_spec(SEED_FILE)
    temps = []
    for seed in range(200):
        values = draw_values(spec, random.Random(seed))
        for name, draw in BUILTIN_DRAWS.items():  # the one table (docs/checks.md)
            assert draw.min <= values[name] <= draw.max
        assert abs(values["temperature"] - 1.0) >= 0.05
        temps.append(values["temperature"])
    assert min(temps) < 0.8 and max(temps) > 1.5  # both sides of 1 are drawn


def test_call_values_are_exactly_the_declared_parameters():
    spec = load_spec(SEED_FILE)
    model = ReferenceModel.drawn(spec, random.Random(1))
    assert set(model.call_values) == {"epsilon_low", "epsilon_high", "temperature"}
    assert model.call_values["temperature"] != 1.0


def test_special_ids_are_not_at_fixed_places_and_small_vocabularies_are_covered():
    from grpo_conform.ops.grpo_logits.generators.token_ids import fill_ids

    firsts, lasts, seen = set(), set(), set()
    for seed in range(12):
        ids = torch.empty(3, 40, dtype=torch.int64)
        placed = fill_ids(ids, 5003, torch.Generator().manual_seed(seed), case=0)
        flat = ids.view(-1)
        assert placed  # call A always holds some (a drawn subset: generators.token_ids)
        seen |= {int(x) for x in flat.tolist() if x in (0, 1, 2, 3, 4999, 5000, 5001, 5002)}
        firsts.add(int(flat[0]))
        lasts.add(int(flat[-1]))
    assert len(firsts) > 3 and len(lasts) > 3 and len(seen) >= 6
    ids = torch.empty(4, 30, dtype=torch.int64)
    fill_ids(ids, 97, torch.Generator().manual_seed(5))
    assert set(ids.view(-1).tolist()) == set(range(97))


def test_advantages_include_tiny_exact_group_and_zero_values_with_drawn_signs():
    spec = find_spec("grpo-token-is")
    negative_at, tiny, zero, group = set(), False, False, False
    for seed in range(30):
        adv = torch.empty(8)
        gen.fill_advantages(adv, spec, torch.Generator().manual_seed(seed))
        negative_at |= {int(i) for i in (adv < 0).nonzero().flatten()}
        tiny |= bool(((adv.abs() > 0) & (adv.abs() < 1e-2)).any())
        zero |= bool((adv == 0).any())
        group |= any(abs(abs(float(a)) - 1.0 / g) < 1e-7 for a in adv for g in (2, 4, 8, 16))
        assert abs(float(adv.mean())) > 0.1 * float(adv.abs().mean())
    assert len(negative_at) > 4 and tiny and zero and group


def test_fp32_floor_grows_with_sharper_rows_and_stays_a_fraction_of_the_scale():
    z = torch.tensor([[1.0, -2.0, 3.0], [30.0, 0.0, -1.0]])
    scale = torch.tensor([1.0, 1.0], dtype=torch.float64)
    cold, hot = fp32_floor(z, 1.0, scale), fp32_floor(z, 0.5, scale)
    assert bool((hot > cold).all())
    assert float(hot.max()) < 2e-4  # |z|/T = 60: still far below bf16 arithmetic (~4% of s)


def test_call_pattern_probes_are_in_the_profiles_and_explore_call_in_none_but_its_own():
    full = PROFILES["full"]
    for probe, check in (("inference-mode", "inference-mode"), ("retained-graph", "retained-graph"),
                         ("repeated-calls", "repeated-calls")):
        assert probe in full and check in PROBES_BY_NAME[probe].feeds and check in CONFORMANCE_CHECKS
    # Late, so that a kernel that turns wrong after N calls fails there and not in the probes before.
    assert full.index("repeated-calls") == len(full) - 3 and full[-2:] == ("end-reread", "process-state")
    assert all(profile[-1] == "process-state" for profile in PROFILES.values())  # every call's effects, in every profile
    assert "retained-graph" not in PROFILES["core"]  # a second gradient of a huge shape
    assert "explore" not in PROFILES and "explore-call" not in PROBES_BY_NAME  # explore.py hands its own probe


def test_k_selects_the_probes_that_feed_the_checks_and_what_they_need():
    names = lambda checks, profile="full": [p.name for p in select(profile, checks)]  # noqa: E731
    assert names(()) == list(PROFILES["full"])
    assert names(("gradient",)) == ["baseline", "new-buffers", "deterministic-mode", "autocast", "zero-row",
                                    "reference-head", "shared-inputs", "extra-seeds", "input-cases", "one-sign",
                                    "trainer-shaped",
                                    "mask-runs", "other-dtypes"]  # other-dtypes: its multi-row call B4
    assert names(("reach",)) == ["reach"]
    assert names(("advantage-sign",)) == ["baseline", "negated-advantages", "advantage-sign"]
    assert names(("row-locality",)) == ["new-buffers", "row-locality"]  # its call reuses D's inputs in Q
    assert names(("repeated-calls",)) == ["repeated-calls"]
    assert names(("row-locality",), "core") == []  # nothing of the profile feeds it: reported as not run
    # a check every call feeds keeps every probe that calls: its verdict under -k is the full run's
    for check in ("runs", "no-mutation", "no-output-reuse"):
        calling = [n for n in PROFILES["full"] if n not in ("advantage-sign", "end-reread", "inference-mode",
                                                             "forward-only", "repeated-calls", "reach", "process-state",
                                                             "rewritten-inputs")]
        assert set(calling) <= set(names((check,))), check
    for check in CONFORMANCE_CHECKS:  # every probe of the profile that records a check is kept
        kept = names((check,))
        assert [n for n in PROFILES["full"] if check in PROBES_BY_NAME[n].feeds and n not in kept] == []


def test_probes_declare_where_they_apply():
    def ruled_out(spec):  # the fused operation's own probes: tests/test_fused_probes.py
        fused = {p.name for p in FUSED_PROBES + VALUE_PROBES}
        return {n: p.applies(spec) for n, p in PROBES_BY_NAME.items() if p.applies(spec) and n not in fused}

    seed = load_spec(SEED_FILE)  # on-policy token-is: no mask, no old or reference log-probs
    assert set(ruled_out(seed)) == {"masked-positions", "far-ratios", "near-ties", "input-cases", "one-input",
                                    "mask-runs", "shared-inputs"}
    kl = find_spec("grpo/token-offpolicy-mask-kl")
    # zero-advantage applies: one zeroed sequence is left out there (the KL term gives it a gradient), every
    # advantage zeroed is not (call E-all, judged against the reference)
    assert set(ruled_out(kl)) == {"advantage-sign", "one-input"}
    masked = find_spec("grpo/token-offpolicy-mask")
    # one-input: grpo-fused-linear only; shared-inputs: no second log-probs input
    assert set(ruled_out(masked)) == {"advantage-sign", "one-input", "shared-inputs"}
    assert ruled_out(find_spec("grpo-fused-linear/token-offpolicy-mask")).get("one-input") is None
    # near-ties runs for both operations where old log-probs meet a clip (the fused one's logits quieted)
    assert ruled_out(find_spec("grpo-fused-linear/token-offpolicy-mask")).get("near-ties") is None
    assert "old log-probs" in ruled_out(find_spec("grpo-fused-linear/token-is"))["near-ties"]


def test_the_engine_is_handed_its_probes_and_imports_no_probe_module():
    """The circle conformance <-> probes <-> judging <-> patterns (issue 30 item 2) stays cut: the
    engine imports none of them, anywhere in the file; judging and patterns do not import the registry."""
    import ast
    from pathlib import Path

    checks = Path(__file__).resolve().parent.parent / "grpo_conform" / "checks"

    def imported(name):
        tree = ast.parse((checks / f"{name}.py").read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
            {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
             for a in n.names}

    forbidden = {f"grpo_conform.checks.{m}" for m in ("probes", "judging", "patterns")}
    assert not imported("conformance") & forbidden
    assert "grpo_conform.checks.probes" not in imported("judging") | imported("patterns")


def test_a_lone_success_slice_holds_advantages_the_drawn_sets_never_reach():
    """trainer-shaped's second call (TS-lone): a micro-batch cut from one group of 32-128 completions with a
    single success; the success's advantage is (G - 1) / sqrt(G) with TRL's unbiased std, the other rows -1 / sqrt(G), at a drawn
    row."""
    from grpo_conform.ops.grpo_probes import LONE_GROUPS, lone_success_slice

    rows_seen, peaks = set(), set()
    for seed in range(40):
        batch = 1 + seed % 8
        a = lone_success_slice(batch, torch.Generator().manual_seed(seed))
        assert a.shape == (batch,) and a.dtype == torch.float64
        peak = float(a.max())
        assert any(abs(peak - (g - 1) / g ** 0.5) < 0.05 for g in LONE_GROUPS), peak
        assert peak > 5.0 and int((a > 0).sum()) == 1  # above what the drawn advantages reach
        assert torch.all(a[a < 0] > -0.2)
        rows_seen.add(int(a.argmax()) if batch == 8 else None)
        peaks.add(round(peak, 1))
    assert len(peaks) == len(LONE_GROUPS) and len(rows_seen - {None}) >= 3  # G and the row are drawn


def test_a_lone_success_slice_of_a_batch_larger_than_every_group():
    """A spec may declare a workload of more rows than the largest group (128): the slice is then cut from a
    group of twice the batch, never shorter than the batch."""
    from grpo_conform.ops.grpo_probes import lone_success_slice

    for batch in (31, 32, 127, 128, 300):
        a = lone_success_slice(batch, torch.Generator().manual_seed(batch))
        assert a.shape == (batch,) and int((a > 0).sum()) == 1 and float(a.max()) > 5.0


def test_trainer_shaped_advantages_sum_to_zero_per_group_and_are_never_all_zero():
    """The gallery's zero-mean-advantages (a kernel that drops the clip on a zero-sum batch) passed in ~1 of 40
    CI runs: at batch 4 one group of rewards in {0, 1, 2} was all tied, so every advantage was 0, in 3 of 81
    draws, and no shortcut keyed on zero-sum advantages was taken. The first group is never all tied now."""
    from grpo_conform.ops.grpo_probes import trainer_advantages

    zero_groups = 0
    for seed in range(300):
        for batch in (2, 4, 8, 6):
            a = trainer_advantages(batch, torch.Generator().manual_seed(seed))
            group = next(g for g in (4, 2, batch) if batch % g == 0)
            sums = a.view(-1, group).sum(-1)
            assert torch.all(sums.abs() < 1e-9), (seed, batch)
            assert bool((a != 0).any()), (seed, batch)
            zero_groups += int((a.view(-1, group) == 0).all(-1).sum())
    assert zero_groups > 0  # tied groups beside the first stay possible (batch 8: two groups of 4)


def test_repeated_calls_make_two_worker_requests_a_call(monkeypatch):
    """The hundred repeated calls ask the worker for forward, then backward and export in one request, as every
    other call does (a request costs ~10 ms on the H200 host; they were three, 2,000 requests more for the
    twenty members of implementations/triton)."""
    from collections import Counter
    from pathlib import Path

    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.checks.patterns import REPEATED_CALLS
    from grpo_conform.isolation.session import WorkerSession

    root = Path(__file__).resolve().parent.parent
    asked = []
    request = WorkerSession.request

    def counted(self, timeout=None, **msg):
        label = str(msg.get("call") or "/".join(msg.get("calls") or ()))
        if label.startswith("RC"):
            asked.append(msg.get("op"))
        return request(self, timeout, **msg)

    monkeypatch.setattr(WorkerSession, "request", counted)
    report = run_check(CheckRequest((str(root / "implementations" / "pytorch"),), device="cpu", members=("token-is",),
                                    workloads=("odd-vocab",), checks=("repeated-calls",), jobs=1))
    outcomes = {o.check: o.status for w in report.implementations[0].members[0].workloads for o in w.outcomes}
    assert outcomes["repeated-calls"] == "pass"
    assert Counter(asked) == {"forward": REPEATED_CALLS, "backward": REPEATED_CALLS}


def test_the_zero_advantage_row_has_a_kept_token():
    """zero-advantage zeroes a row with a kept token: on an empty row the gradient is 0 whatever the kernel
    does (`revives-zero-advantage-masked` passed 4 runs of 12 when an empty row was drawn). No mask, or no
    kept token at all: any row."""
    import types

    from grpo_conform.ops import operation_for
    from grpo_conform.ops.grpo_probes import live_row

    spec = find_spec("grpo/token-offpolicy-mask")
    mask = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 1, 1]], dtype=torch.bool)
    run = types.SimpleNamespace(rw=types.SimpleNamespace(axes={"batch": 4}), spec=spec, op=operation_for(spec),
                                rng=random.Random(0))
    picked = {live_row(run, types.SimpleNamespace(tensors={"completion_mask": mask})) for _ in range(200)}
    assert picked == {1, 3}
    empty = types.SimpleNamespace(tensors={"completion_mask": torch.zeros(4, 3, dtype=torch.int64)})
    assert {live_row(run, empty) for _ in range(200)} == {0, 1, 2, 3}
    token_is = find_spec("grpo/token-is")
    run_is = types.SimpleNamespace(rw=run.rw, spec=token_is, op=operation_for(token_is), rng=random.Random(1))
    assert {live_row(run_is, types.SimpleNamespace(tensors={})) for _ in range(200)} == {0, 1, 2, 3}


def test_interleaved_rounds_draw_more_graphs_and_any_backward_order():
    """The interleaved probe's rounds (checks/graphs.py): two at most in flight let a pool of two workspaces per shape
    pass (`saved-lse-ring-of-two`). Each round backpropagates every graph exactly once; `order` holds 3-5 graphs and
    its backward orders are not only the reverse or the forward one; memory (`room`) bounds the count, never below 2."""
    from grpo_conform.checks.graphs import ORDER_GRAPHS, SUM_GRAPHS, plan

    orders, counts = set(), set()
    for seed in range(200):
        rounds = plan(seed, room=8)
        assert [r.name for r in rounds] == ["sum", "order"] and plan(seed, room=8) == rounds
        for r, (low, high) in zip(rounds, (SUM_GRAPHS, ORDER_GRAPHS)):
            assert low <= r.graphs == r.drawn <= high and 0 <= r.scaled < r.graphs
            assert sorted(k for g in r.groups for k in g) == list(range(r.graphs))
        order = tuple(k for g in rounds[1].groups for k in g)
        orders.add(order)
        counts.add(rounds[1].graphs)
    assert counts == set(range(ORDER_GRAPHS[0], ORDER_GRAPHS[1] + 1))
    assert len({o for o in orders if o not in (tuple(range(len(o))), tuple(reversed(range(len(o)))))}) > 20
    assert all(r.graphs == 2 for r in plan(3, room=0)) and max(r.graphs for r in plan(3, room=1)) <= 3
