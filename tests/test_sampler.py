"""GRPO_CONFORM_SAMPLE (grpo_conform/sampler.py): samples land in the phase open at the time and name the
function that holds the thread, and nothing sampled outlives its sample (a kept frame keeps its tensors)."""

from __future__ import annotations

import gc
import os
import time
import weakref

from grpo_conform.phases import PhaseClock
from grpo_conform.sampler import ENV, Sampler, sampling


def _spin_in_judging(seconds: float) -> int:
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


def test_samples_go_to_the_open_phase_and_name_the_function_that_holds_the_thread():
    clock = PhaseClock()
    sampler = Sampler(clock, interval_s=0.001).start()
    with clock("judge"):
        _spin_in_judging(0.3)
    time.sleep(0.1)  # no phase open: `other`
    sampler.stop()
    assert sampler.samples.get("judge", 0) >= 20 and sampler.samples.get("other", 0) >= 5
    judged = {name: n for (phase, name), n in sampler.inside.items() if phase == "judge"}
    spin = next(n for name, n in judged.items() if name.endswith(" _spin_in_judging"))
    assert spin >= 0.9 * sampler.samples["judge"]  # nearly every judging sample is inside it
    assert not any(name.endswith(" _spin_in_judging") for (phase, name) in sampler.inside if phase == "other")
    report = sampler.report()
    judge_part = report.split("== judge:")[1].split("\n== ")[0]
    assert "_spin_in_judging" in judge_part and "where the thread stood" in judge_part


class _Held:
    pass


def _hold_and_spin(seconds: float):
    held = _Held()  # a local of the sampled frame, as a workload's tensors are
    ref = weakref.ref(held)
    _spin_in_judging(seconds)
    return ref


def test_nothing_of_a_sampled_frame_outlives_it():
    """Samples 0.25 s apart, at least one inside the frame: right after the frame returns (long before the
    next sample) its local must be gone. A sampler that keeps the last frame (or stack) it saw until its
    next look fails: that is how round34a's first try held a workload's tensors past its leak check."""
    clock = PhaseClock()
    sampler = Sampler(clock, interval_s=0.25).start()
    ref = _hold_and_spin(0.6)
    gc.collect()
    alive = ref() is not None
    sampler.stop()
    assert sum(sampler.samples.values()) >= 2 and not alive


def test_the_switch_writes_one_report_per_process_and_nothing_when_unset(tmp_path, monkeypatch):
    clock = PhaseClock()
    monkeypatch.delenv(ENV, raising=False)
    with sampling(clock):
        _spin_in_judging(0.01)
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(ENV, str(tmp_path / "samples"))
    with sampling(clock):
        with clock("inputs"):
            _spin_in_judging(0.1)
    report, stacks = sorted((tmp_path / "samples").iterdir())
    assert report.name.startswith("sample-") and "== inputs:" in report.read_text()
    assert stacks.name == f"stacks-{os.getpid()}.txt"  # written every STACKS_EVERY_S; the run was shorter


def test_a_hung_run_leaves_every_thread_s_stack(tmp_path, monkeypatch):
    """A run that never returns never writes its report: the stacks file says where it stood meanwhile."""
    import grpo_conform.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "STACKS_EVERY_S", 0.05)
    monkeypatch.setenv(ENV, str(tmp_path))
    with sampling(PhaseClock()):
        _spin_in_judging(0.3)
        text = (tmp_path / f"stacks-{os.getpid()}.txt").read_text()
    assert "_spin_in_judging" in text and "Thread" in text


def test_stacks_that_cannot_be_written_cost_nothing_but_a_line(tmp_path, capsys):
    """A profiling switch pointing at a folder that cannot be written loses its stacks, not the run."""
    from grpo_conform.sampler import stack_dumps

    blocker = tmp_path / "file"
    blocker.write_text("")
    assert stack_dumps(blocker / "under-a-file" / "stacks.txt") is None
    assert "no stack dumps" in capsys.readouterr().err
