"""Shared fixtures. Tests run on the CPU; Triton code runs under TRITON_INTERPRET=1 in workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# `check`'s default `--jobs auto` runs a multi-member CPU check in one slot process per core. The suite
# already fills the cores (xdist -n 2): its checks run serially unless a test asks for slots (the
# subprocesses it starts inherit this). tests/test_gate.py tests auto itself.
os.environ.setdefault("GRPO_CONFORM_JOBS", "1")
# The workers' compile-cache stores (grpo_conform/isolation/compile_cache.py) of this test run: in a
# directory of its own, not the user's ~/.cache (xdist's workers inherit it from the controller).
if "GRPO_CONFORM_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["GRPO_CONFORM_CACHE_DIR"] = tempfile.mkdtemp(prefix="grpo-conform-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GRPO_CONFORM_CACHE_DIR"], True)  # by the process that made it
pytest_plugins = ["cpu_time"]  # --cpu-durations=N (tests/cpu_time.py)


def process_gone(pid: int) -> bool:
    """The process has exited (or is a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")
def cli_here(*args, cwd=ROOT, env_extra=None) -> "subprocess.CompletedProcess":
    """A `grpo-conform` command through click's runner in this process, answered as a `python -m
    grpo_conform` subprocess answers (exit code, stdout, stderr): for a test of what a command prints and
    exits with, not of a process. A subprocess pays a new interpreter and, for most commands, torch and a
    zygote (2-8 s CPU each; docs/timing.md, "Fourth pass"). The entry point and `check` as processes stay
    tested (test_cli.test_version_and_help; test_isolation_attacks' SIGINT/SIGTERM to `check`,
    test_sandbox); `--jobs` slots are processes either way (test_isolation_slots, test_gate_e2e). An
    exception the command did not turn into an exit code comes back as the interpreter shows it: exit 1,
    its traceback on stderr. The CLI's two consoles are sized to $COLUMNS for the call, as a new process
    sizes them (without this they keep the width they took when this process first imported the CLI).
    A test of the terminal itself (no $COLUMNS, a narrow one) stays a subprocess."""
    import os
    import signal
    import subprocess
    import traceback

    from click.testing import CliRunner

    from grpo_conform import cli

    env = {"COLUMNS": "1000", "GRPO_CONFORM_SIGNING_KEY": None, "GRPO_CONFORM_SIGNING_KEY_FILE": None,
           **(env_extra or {})}
    here, handlers = os.getcwd(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    # the CLI's consoles as a new process with this $COLUMNS sizes them (their width is fixed at import)
    sizes = {c: (c._width, c._height) for c in (cli.out, cli.err)}
    for c in sizes:
        c.size = (int(env["COLUMNS"]), 25)
    os.chdir(cwd)
    try:
        result = CliRunner(env=env).invoke(cli.main, [str(a) for a in args], prog_name="grpo-conform")
    finally:  # `check` installs its Ctrl-C and SIGTERM handlers: this process's own come back
        os.chdir(here)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for c, (width, height) in sizes.items():
            c._width, c._height = width, height
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, stderr)


SPEC_FILE = ROOT / "specs" / "grpo-token-is.v1.json"
GALLERY = Path(__file__).resolve().parent / "gallery"


@pytest.fixture(scope="session")
def spec():
    from grpo_conform.spec import load_spec

    return load_spec(SPEC_FILE)


def pytest_itemcollected(item):
    """Tests that share a module-scoped fixture (a worker run, a subprocess, a wheel) go to one xdist
    worker (`--dist loadgroup`, pyproject.toml), so that the fixture is built once, not once per worker."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope == "module":
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{name}"))
            return


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The group in the node id where xdist left it out, the slow lane's longest ungrouped tests first
    (LONGEST_FIRST), then the peers lane's own selection (tests/peers/peer_lane.py: deselected unless
    `-m peers`).

    xdist 3.8 puts the group into the node id (`test@group`, which its loadgroup scheduler reads) by
    setting `item._nodeid`; pytest 9.2 (CI's) keeps the id in `item._id`, so the suffix was lost there
    and every module fixture of the slow lane was built on both workers (CI's durations of 2026-12-03:
    test_gate_e2e's `serial`, test_triton_members' `results` twice). Added here when missing (pytest 9.0
    still takes xdist's, which runs before this trylast hook); an id that cannot take it stops the run."""
    grouped = set()
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is None:
            continue
        suffix = f"@{mark.args[0]}"
        if getattr(config.option, "loadgroup", False) and not item.nodeid.endswith(suffix):
            _rename(item, item.nodeid + suffix)
            if not item.nodeid.endswith(suffix):  # a pytest that stores node ids another way again
                raise pytest.UsageError(f"tests/conftest.py: could not put {suffix} into {item.nodeid}")
        grouped.add(item.nodeid)
    items[:] = longest_first(items, grouped)
    _peers_modifyitems(config, items)


def _rename(item, nodeid: str) -> None:
    """What xdist does for loadgroup, for pytest 9.2's structured node ids (`Node._id`) too."""
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid


#: The lanes' longest tests that share no module fixture, longest first (CI's `--durations=25`,
#: docs/timing.md "Test suite"). xdist hands out the groups with the most tests first (loadscope
#: reorder: test_triton_members' fixture), then single tests in collection order: started first,
#: the long ones do not end the lane alone on one worker while the other idles. A test that moved
#: or was renamed only loses its place here.
LONGEST_FIRST = (  # by wall seconds in a -n 2 run of both lanes (2026-12-06, twenty-ninth session: re-ranked from
    # --durations=30 of a 307 s run whose 547 s of CPU would pack into 274 s; the interpreted compare_fused
    # process, 49 s, was not named and could start last)
    "tests/test_compare_fused.py::test_the_interpreted_cases_in_a_process_of_their_own",
    "tests/test_bundled.py::test_the_other_members_pass_every_probe_on_pytorch",
    "tests/test_report.py::test_the_committed_page_is_what_report_builds_from_the_committed_evidence",
    "tests/test_bundled.py::test_bundled_implementation_is_conformant_on_cpu[triton]",
    "tests/test_fp32_logprob.py::test_sampled_false_failure_rate_of_honest_fp32",
    "tests/test_scale_out_slurm.py::test_slurm_array_and_afterok_merge_equal_the_serial_run",
    "tests/test_isolation_slots.py",
    "tests/test_report.py::test_the_page_loads_in_headless_chromium",
    "tests/test_gate_e2e.py::test_a_hang_costs_one_timeout",
    "tests/test_sweep_logits.py::test_sweep_jobs_end_to_end_on_the_cpu",
    "tests/test_fp32_logprob.py::test_pinned_seeds_pass_through_run_check",
    "tests/test_bundled.py::test_bundled_implementation_is_conformant_on_cpu[pytorch]",
    "tests/test_isolation_attacks.py::test_a_signal_to_the_validator_leaves_no_process_and_no_file",
    "tests/test_scale_out_slurm.py::test_a_shard_that_cannot_run_holds_the_merge_back",
    "tests/test_members.py::test_liger_matches_the_reference_for_every_member_it_declares",
    "tests/test_members.py::test_torch_compile_matches_the_reference",
    "tests/test_bundled.py::test_liger_inplace_fails_the_mutation_check",
)


def longest_first(items, grouped):
    """Ungrouped tests named in LONGEST_FIRST to the front, in its order; then the other ungrouped slow
    tests, then the rest as collected (a grouped test keeps its place: its module's tests stay together
    in a run without xdist). In a run of both lanes (.ci/run) the fast lane's ~1,250 short tests are
    the last that xdist hands out, so both workers finish within a short test of each other; a run of
    one lane keeps its order (every test slow, or none)."""
    last = len(LONGEST_FIRST)

    def rank(item):
        if item.nodeid in grouped:
            return last, 1
        named = next((i for i, p in enumerate(LONGEST_FIRST)
                      if item.nodeid == p or item.nodeid.startswith((p + "::", p + "["))), last)
        return named, 0 if named < last or item.get_closest_marker("slow") is not None else 1
    return sorted(items, key=rank)  # stable


# The peers lane's hooks (tests/peers/peer_lane.py): its selection (above) and a per-member table at the end
from peers.peer_lane import pytest_collection_modifyitems as _peers_modifyitems  # noqa: E402
from peers.peer_lane import pytest_terminal_summary  # noqa: E402,F401
