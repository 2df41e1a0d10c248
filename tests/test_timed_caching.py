"""The `caching` check on masked members compares work-normalised times (checks/timed.py): every
fresh call draws a new mask and moves its own rows, the identical calls always the warm set's."""

from __future__ import annotations

import types

from grpo_conform.checks.timed import WorkloadTiming
from grpo_conform.timing import Distribution


def _timing(warm_rows: int) -> WorkloadTiming:
    t = object.__new__(WorkloadTiming)
    t.warm = types.SimpleNamespace(name="TW")
    t.set_masks = {"TW": types.SimpleNamespace(unmasked=warm_rows)}
    # a floor proportional to the rows a call must read: 100 ns a row
    t.floor_of = lambda protocol, m=None: types.SimpleNamespace(dram_ns=100 * m.unmasked)
    return t


def _verdict(t: WorkloadTiming, calls, identical) -> bool:
    cache_d = t._work_normalised("forward", calls, identical)
    fresh_d = Distribution.of([c["event_ns"] for c in calls])
    ident_d = Distribution.of([c["event_ns"] for c in identical])
    result = {"protocol": "forward", "below_floor": False}
    floor = types.SimpleNamespace(meaningful=False, strict_ns=None)
    found = t._findings(result, fresh_d, ident_d, Distribution.of([1] * 10), [], floor, [], cache_d)
    return found["caching"][0]  # True: passes (no cache)


def _calls(rows_list, ns_per_row):
    return [{"event_ns": int(r * ns_per_row), "mask": types.SimpleNamespace(unmasked=r)} for r in rows_list]


def test_an_honest_kernel_whose_warm_mask_keeps_fewer_rows_is_not_a_cache():
    t = _timing(warm_rows=4000)
    fresh = _calls([4400, 4800, 5200, 5600, 5000, 4600, 5400, 4900, 5100, 5300] * 2, ns_per_row=110)
    identical = [{"event_ns": 4000 * 110 + d} for d in range(10)]  # the same speed per row, fewer rows
    assert _verdict(t, fresh, identical)
    # raw medians would have called it cached: 0.44 ms against 0.55 ms
    raw = Distribution.of([c["event_ns"] for c in identical]).median_ns / Distribution.of(
        [c["event_ns"] for c in fresh]).median_ns
    assert raw < 0.9


def test_a_cache_is_still_caught_after_normalising():
    t = _timing(warm_rows=5000)
    fresh = _calls([4400, 4800, 5200, 5600, 5000, 4600, 5400, 4900, 5100, 5300] * 2, ns_per_row=110)
    identical = [{"event_ns": 5000 * 60 + d} for d in range(10)]  # the warm set's rows at half the time
    assert not _verdict(t, fresh, identical)


def test_unmasked_members_compare_raw_times():
    t = _timing(warm_rows=1)
    t.set_masks = {}
    calls = [{"event_ns": 1000 + d} for d in range(20)]
    assert t._work_normalised("forward", calls, [{"event_ns": 1000}]) is None
