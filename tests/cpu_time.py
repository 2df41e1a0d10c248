"""`--cpu-durations=N`: the N tests that cost the most CPU seconds (this process and the child
processes it waited for: workers, CLI subprocesses), and the total. On a shared machine wall times
say more about the load than about a test; CPU seconds compare tests fairly (docs/timing.md).
Loaded from conftest.py; elsewhere (another checkout) with `-p cpu_time` and tests/ on PYTHONPATH."""

from __future__ import annotations

import os
import resource

import pytest

_COST: dict[str, float] = {}
_WALL: dict[str, float] = {}  # setup + call + teardown, as --durations adds them


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests with the most CPU seconds (self + waited-for children), and the total")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item._cpu_start = _cpu()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's CPU seconds (setup, call, teardown) ride on its teardown report, so that under xdist
    (`-n 2`, as CI runs) the controller, which prints the summary, gets what each worker measured."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and hasattr(item, "_cpu_start"):
        report.user_properties.append(("cpu_s", _cpu() - item._cpu_start))


def pytest_runtest_logreport(report):
    _WALL[report.nodeid] = _WALL.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown":
        for key, value in report.user_properties:
            if key == "cpu_s":
                _COST[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _COST:
        return
    tr = terminalreporter
    tr.write_sep("=", f"{min(n, len(_COST))} most CPU seconds (each test's pytest process: self + waited-for children)")
    for nodeid, cost in sorted(_COST.items(), key=lambda kv: -kv[1])[:n]:
        tr.write_line(f"{cost:8.2f}s cpu {_WALL.get(nodeid, 0.0):8.2f}s wall  {nodeid}")
    tr.write_line(f"total {sum(_COST.values()):.1f} s CPU, {sum(_WALL.values()):.1f} s wall over {len(_COST)} tests; "
                  "load average "
                  + " ".join(f"{x:.1f}" for x in os.getloadavg()))
