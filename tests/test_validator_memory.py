"""GPU memory of grpo-conform's own process between workloads (docs/timing.md, "Tenth session"): the
stop that keeps a leak of the validator from failing honest implementations. The worker's side
(unbind collects its garbage, names what it still holds; one IPC descriptor per buffer) is in
tests/test_worker_protocol.py."""

from __future__ import annotations


def test_a_run_stops_when_the_validator_keeps_gpu_memory_between_workloads():
    """round30a on the H200: grpo-conform's process held 122 GiB at the tenth member, and two honest members
    then failed `runs` (their calls ran out of memory). After each CUDA workload the bytes still allocated are
    recorded; past LEAK_LIMIT the run stops with a reason that says so, naming storages the worker kept."""
    from grpo_conform.check import LEAK_LIMIT, memory_stop

    assert memory_stop({}, "w") is None  # the CPU records none
    assert memory_stop({"cuda_allocated_after": LEAK_LIMIT}, "w") is None
    why = memory_stop({"cuda_allocated_after": 13 << 30}, "triton dapo-mask mask-b8")
    assert why.startswith("not run:") and "13.0 GiB" in why and "dapo-mask mask-b8" in why and "leak" in why
    why = memory_stop({"cuda_allocated_after": 5 << 30, "held_after_unbind_timed": ["T0.logits", "TW.logits"]}, "w")
    assert "T0.logits, TW.logits" in why


def test_the_compile_ahead_proxy_held_while_measured_is_not_a_leak():
    """H200, seventeenth session: a slot's compile-ahead proxy at seed-b16's shape (7.8 GiB, held by the slot's
    process for its second worker) stopped the run as a leak of grpo-conform's own. What the slot records as
    held for it (check._check_members: `cuda_held_by_compile_ahead`) is allowed for, and nothing more."""
    from grpo_conform.check import LEAK_LIMIT, memory_stop

    proxy = 8 << 30
    assert memory_stop({"cuda_allocated_after": proxy + LEAK_LIMIT, "cuda_held_by_compile_ahead": proxy}, "w") is None
    why = memory_stop({"cuda_allocated_after": proxy + LEAK_LIMIT + 1, "cuda_held_by_compile_ahead": proxy}, "w")
    assert why is not None and why.startswith("not run:")
    assert memory_stop({"cuda_allocated_after": proxy + LEAK_LIMIT}, "w") is not None  # without it: a leak
