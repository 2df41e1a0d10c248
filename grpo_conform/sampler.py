"""`GRPO_CONFORM_SAMPLE=DIR`: where a check process's wall time goes, by phase and by function.

The phase clock (phases.py) says how long each phase took; it cannot say which code inside a phase
waits. This switch samples the process's main thread every INTERVAL_S from a daemon thread and files
each sample under the innermost phase open at that moment (`other` when none is): the functions on the
stack (each counted once per sample, so a function's share is the time spent inside it) and the line
the thread stood on. It runs in the process that calls `run_check`: the run itself, or each slot of
--jobs/--gpus (their workers have their own switch, GRPO_CONFORM_WORKER_PROFILE). At the run's end it
writes DIR/sample-PID.txt. What it found first (docs/timing.md, "Fourteenth session"): 73.5% of a timed
turn waits for the worker's `time` requests.

A profiling switch (provenance.PROFILING_SWITCHES): a sampled run writes no evidence record, although
only the parent's host work is slowed (the timed calls run in the worker, on the GPU's clock).

Nothing sampled is kept but strings: a frame held past its sample keeps its locals alive, and the
tensors among them would outlive their workload (the validator's own leak check stopped a run over
exactly that, round34a's first try).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ENV = "GRPO_CONFORM_SAMPLE"
INTERVAL_S = 0.002
STACKS_EVERY_S = 20.0  # how often every thread's stack is written beside the report
TOP = 60  # functions listed per phase (lines: half as many)


class Sampler:
    def __init__(self, phases, interval_s: float = INTERVAL_S):
        self.phases, self.interval_s = phases, interval_s
        self.samples: dict[str, int] = {}  # phase -> samples
        self.inside: dict[tuple[str, str], int] = {}  # (phase, function) -> samples with it on the stack
        self.lines: dict[tuple[str, str], int] = {}  # (phase, file:line function) -> samples standing there
        self._target = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="grpo-conform-sampler", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        frame = sys._current_frames().get(self._target)
        if frame is None:
            return
        phase = self.phases.current() or "other"
        self.samples[phase] = self.samples.get(phase, 0) + 1
        code = frame.f_code
        where = (phase, f"{_short(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        self.lines[where] = self.lines.get(where, 0) + 1
        seen = set()
        while frame is not None:
            code = frame.f_code
            name = f"{_short(code.co_filename)}:{code.co_firstlineno} {code.co_name}"
            if name not in seen:
                seen.add(name)
                self.inside[(phase, name)] = self.inside.get((phase, name), 0) + 1
            frame = frame.f_back
        del frame, code  # strings only past this point (the module docstring says why)

    def report(self) -> str:
        total = sum(self.samples.values())
        out = [f"{total} samples every {self.interval_s * 1e3:g} ms (a share is of its phase's samples)"]
        for phase, n in sorted(self.samples.items(), key=lambda kv: -kv[1]):
            out.append(f"== {phase}: {n} samples ({100 * n / max(1, total):.1f}%), inside")
            out += _rows(self.inside, phase, n, TOP)
            out.append(f"-- {phase}: where the thread stood")
            out += _rows(self.lines, phase, n, TOP // 2)
        return "\n".join(out) + "\n"


def _rows(table: dict[tuple[str, str], int], phase: str, n: int, top: int) -> list[str]:
    rows = sorted(((v, k[1]) for k, v in table.items() if k[0] == phase), key=lambda r: (-r[0], r[1]))[:top]
    return [f"{v:8d} {100 * v / n:5.1f}%  {name}" for v, name in rows]


def _short(path: str) -> str:
    """The last two parts of a path: package and module."""
    return "/".join(path.replace(os.sep, "/").split("/")[-2:])


def stack_dumps(path: Path):
    """Every thread's stack every STACKS_EVERY_S appended to `path` (the file, kept open; None where it cannot
    be written, said on stderr): a run or worker that hangs never writes its report, and this says where each
    thread stood (a slot waiting on the GPU gate, a worker reply)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stacks = open(path, "w")  # noqa: SIM115 (closed by the caller, or at the process's exit)
    except OSError as exc:
        print(f"grpo-conform: no stack dumps ({path}: {exc})", file=sys.stderr)
        return None
    faulthandler.dump_traceback_later(STACKS_EVERY_S, repeat=True, file=stacks)
    return stacks


@contextmanager
def sampling(phases) -> Iterator[None]:
    """Samples the calling thread while the block runs, when GRPO_CONFORM_SAMPLE names a folder, and
    writes the report there (a report that cannot be written is said on stderr: it never fails the run)."""
    folder = os.environ.get(ENV, "").strip()
    if not folder or folder == "0":
        yield
        return
    sampler = Sampler(phases).start()
    stacks = stack_dumps(Path(folder) / f"stacks-{os.getpid()}.txt")
    try:
        yield
    finally:
        if stacks is not None:
            faulthandler.cancel_dump_traceback_later()
            stacks.close()
        sampler.stop()
        path = Path(folder) / f"sample-{os.getpid()}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(sampler.report())
        except OSError as exc:
            print(f"grpo-conform: {ENV}: the sample report was not written ({path}: {exc})", file=sys.stderr)
