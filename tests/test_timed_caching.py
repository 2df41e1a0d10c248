"""The `caching` check on masked members compares the fresh calls' times moved to the warm set's work
(checks/timed.py): every fresh call draws a new mask and moves its own rows, the identical calls always
the warm set's, and how time follows rows is fitted on the fresh calls (a dense kernel's does not)."""

from __future__ import annotations

import types

import pytest

from grpo_conform.checks.timed import WorkloadTiming, work_slope
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


def _dense(rows_list, ns):
    """A kernel that reads every row whatever the mask (torch eager, Liger): the same time for every call."""
    return [{"event_ns": ns + 37 * (k % 5), "mask": types.SimpleNamespace(unmasked=r)} for k, r in enumerate(rows_list)]


def test_a_dense_kernel_whose_warm_mask_keeps_more_rows_is_not_a_cache():
    """The H200 case of 2026-12-05: PyTorch eager's forward at mask-b8, raw medians 9.488 ms identical against
    9.484 ms fresh, called cached at 0.855x when every kernel was taken to scale with its rows."""
    t = _timing(warm_rows=5600)
    fresh = _dense([4400, 4800, 5200, 5000, 4600, 5400, 4900, 5100, 5300, 4700] * 2, ns=9_484_000)
    identical = [{"event_ns": 9_488_000 + d} for d in range(10)]
    assert _verdict(t, fresh, identical)
    proportional = Distribution.of([c["event_ns"] * 5600 / c["mask"].unmasked for c in fresh]).median_ns
    assert 9_488_000 / proportional < 0.9  # what the old normalisation said


def test_a_dense_kernel_that_caches_is_caught_whatever_the_warm_mask():
    for warm_rows in (4000, 5000, 5600):
        t = _timing(warm_rows=warm_rows)
        fresh = _dense([4400, 4800, 5200, 5000, 4600, 5400, 4900, 5100, 5300, 4700] * 2, ns=9_484_000)
        identical = [{"event_ns": 6_000_000 + d} for d in range(10)]  # a cache saving a third
        assert not _verdict(t, fresh, identical), warm_rows


def test_the_fitted_slope_follows_the_kernel_not_the_mask():
    rows = [4400, 4800, 5200, 5600, 5000, 4600]
    assert work_slope([100 * r for r in rows], [110 * r for r in rows]) == pytest.approx(1.1)  # proportional
    assert work_slope([100 * r for r in rows], [9_000_000] * len(rows)) == 0.0  # dense
    assert work_slope([100.0] * 6, [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == 0.0  # one work: nothing to fit
    noisy = [110 * r for r in rows]
    noisy[2] *= 3  # one slow call (a context switch) barely moves the median of pairwise slopes
    assert work_slope([100 * r for r in rows], noisy) == pytest.approx(1.1, rel=0.15)
    assert work_slope([1.0, 2.0, 3.0], [30.0, 20.0, 10.0]) == 0.0  # never negative
