"""The worker's watch of process-global state around a call (isolation/global_state.py, the
no-global-side-effects check), in this process: what it reports, what it puts back, and that an
honest call reports nothing. The gallery folders leaks-default-dtype and reseeds-global-rng run it
through the worker."""

from __future__ import annotations

import random

import torch

from grpo_conform.isolation.global_state import Watch


def _states(watch: Watch) -> list[str]:
    return [e["state"] for e in watch.report()]


def test_an_honest_call_reports_nothing_even_one_that_draws_random_numbers() -> None:
    watch = Watch()
    for i in range(5):
        watch.around(f"A#{i}", "forward", lambda: (torch.rand(3).sum(), random.random()))
    assert watch.report() == []


def test_a_reseed_is_reported_by_its_seed_and_by_a_repeated_state() -> None:
    watch = Watch()

    def reseed() -> None:
        torch.manual_seed(1234)
        torch.rand(1)

    watch.around("R#1", "forward", reseed)
    watch.around("R#2", "forward", reseed)
    assert {"torch.initial_seed()", "torch CPU generator"} <= set(_states(watch))
    python = Watch()
    for i in range(2):
        python.around(f"P#{i}", "backward", lambda: random.seed(7))
    assert _states(python) == ["Python's random"]


def test_settings_are_reported_and_put_back() -> None:
    watch = Watch()
    before = torch.get_default_dtype(), torch.get_num_threads()
    watch.around("D#1", "forward", lambda: (torch.set_default_dtype(torch.float64), torch.set_num_threads(1)))
    with torch.no_grad():
        watch.around("G#2", "forward", lambda: torch.set_grad_enabled(True))
        assert not torch.is_grad_enabled()  # put back inside the caller's no_grad
    effects = {e["state"]: e for e in watch.report()}
    assert effects["torch.get_default_dtype()"]["after"] == "torch.float64"
    assert effects["torch.is_grad_enabled()"]["before"] == "False"
    assert (torch.get_default_dtype(), torch.get_num_threads()) == before
    if before[1] != 1:
        assert "torch.get_num_threads()" in effects
    assert watch.report() == []  # cleared once reported
