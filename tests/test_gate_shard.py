"""--shard weighs units by the spec's size model (traffic-v1 bytes, ranged axes at their midpoint)
and deals them so that no shard ends more than one unit above the lightest."""

from __future__ import annotations

import torch

from conftest import ROOT
from grpo_conform.check import CheckRequest
from grpo_conform.floors import resolve_for_floor, tensor_traffic
from grpo_conform.gate.plan import build_plan
from grpo_conform.gate.shard import UNIT_BASE_COST, assign, unit_cost, workload_bytes


def test_a_unit_weighs_its_traffic_so_float32_weighs_more_than_bfloat16(spec):
    w = spec.workload("fp32-small")
    as_bf16 = w.model_copy(update={"dtypes": {**w.dtypes, "logits": "bfloat16"}})
    numel = spec.resolve(w).numel("logits")
    # logits read and their gradient written: 2 bytes more per element each way in float32
    assert workload_bytes(spec, w) - workload_bytes(spec, as_bf16) == 2 * 2 * numel
    assert workload_bytes(spec, w) == sum(t.bytes for t in tensor_traffic(spec, spec.resolve(w)))


def test_a_ranged_workload_weighs_its_midpoint(spec):
    w = spec.workload("drawn-bf16")
    ranged = {a: r for a, r in w.axes.items() if not isinstance(r, int)}
    assert ranged, "drawn-bf16 has no ranged axis any more: pick another workload"
    smallest = sum(t.bytes for t in tensor_traffic(spec, resolve_for_floor(spec, w)))
    largest_axes = {**w.axes, **{a: r.max for a, r in ranged.items()}}
    largest = workload_bytes(spec, w.model_copy(update={"axes": largest_axes}))
    assert smallest < workload_bytes(spec, w) < largest


def test_shards_of_the_shipped_implementations_are_balanced():
    plan = build_plan(CheckRequest((str(ROOT / "implementations"),), device="cuda"), torch.device("cuda"))
    units = [u for p in plan.implementations for u in p.units()]
    costs = {u: unit_cost(plan, u) for u in units}
    assert len(set(costs.values())) > 3 and min(costs.values()) >= UNIT_BASE_COST
    for n in (2, 3, 4, 7):
        where = assign(plan, n)
        assert set(where) == set(units) and set(where.values()) == set(range(1, n + 1))
        load = [sum(c for u, c in costs.items() if where[u] == k) for k in range(1, n + 1)]
        # greedy heaviest-first: the heaviest shard is at most one unit above the lightest
        assert max(load) - min(load) <= max(costs.values()), (n, load)
        assert max(load) <= 1.05 * sum(load) / n, (n, load)  # and, with 162 units, within 5 % of even
