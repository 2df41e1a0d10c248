"""`--cpu-durations=N`: the N tests that cost the most CPU seconds (this process and the child
processes it waited for: workers, CLI subprocesses), and the total. On a shared machine wall times
say more about the load than about a test; CPU seconds compare tests fairly (docs/timing.md).
Loaded from conftest.py; elsewhere (another checkout) with `-p cpu_time` and tests/ on PYTHONPATH."""

from __future__ import annotations

import os
import resource

import pytest

_COST: dict[str, float] = {}


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests with the most CPU seconds (self + waited-for children), and the total")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu()
    yield
    _COST[item.nodeid] = _cpu() - start


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _COST:
        return
    tr = terminalreporter
    tr.write_sep("=", f"{min(n, len(_COST))} most CPU seconds (pid {os.getpid()}: self + waited-for children)")
    for nodeid, cost in sorted(_COST.items(), key=lambda kv: -kv[1])[:n]:
        tr.write_line(f"{cost:8.2f}s cpu  {nodeid}")
    tr.write_line(f"total {sum(_COST.values()):.1f} s CPU over {len(_COST)} tests; load average "
                  + " ".join(f"{x:.1f}" for x in os.getloadavg()))
