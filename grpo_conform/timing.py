"""The one place that times anything.

Method (recorded with every result as `METHOD`): CUDA events on the current stream around the
call, then a device-wide synchronize; host wall time around the same region; warmup excluded;
L2 flushed before every timed call by writing a buffer of at least twice the L2 size; fresh
inputs for every warmup and timed call (rewritten in place at the same address, rotating over
several buffer sets); a random subset of timed outputs re-checked against the float64
reference; median with quantiles; repetitions recorded.

Timed calls of an implementation run in its worker (the parent drives each call and regenerates
the inputs between calls); `time_cuda` times code of our own in this process (ceilings).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

METHOD = (
    "CUDA events on the current stream around the call plus a device-wide synchronize; before the start event "
    "the GPU is kept busy (a spin of at least 0.2 ms and 1.5x the host time to enqueue one call, measured on an "
    "untimed call before each batch, then the L2 flush) so host launch overhead stays off the clock; warmup excluded; "
    "L2 flushed before each timed call (buffer >= 2x L2 written, then another >= 2x L2 read so no dirty line is "
    "written back inside the call); fresh inputs every call, rewritten in place "
    "and rotated over buffer sets; random subset of timed outputs re-checked against the float64 reference; "
    "median and quantiles of per-call times"
)


@dataclass(frozen=True)
class Distribution:
    """Per-call times in integer nanoseconds, summarised by median and quantiles."""

    samples_ns: tuple[int, ...]

    @classmethod
    def of(cls, samples: Sequence[int]) -> "Distribution":
        if not samples:
            raise ValueError("a distribution needs at least one sample")
        return cls(tuple(int(s) for s in samples))

    def quantile(self, q: float) -> int:
        s = sorted(self.samples_ns)
        if len(s) == 1:
            return s[0]
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return int(round(s[lo] + (s[hi] - s[lo]) * (pos - lo)))

    @property
    def median_ns(self) -> int:
        return int(round(statistics.median(self.samples_ns)))

    def to_json(self) -> dict[str, Any]:
        return {
            "median_ns": self.median_ns,
            "p10_ns": self.quantile(0.10),
            "p25_ns": self.quantile(0.25),
            "p75_ns": self.quantile(0.75),
            "p90_ns": self.quantile(0.90),
            "min_ns": min(self.samples_ns),
            "max_ns": max(self.samples_ns),
            "reps": len(self.samples_ns),
        }


def flush_bytes_for(device: torch.device) -> int:
    """At least twice the L2 size (and never under 256 MiB)."""
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return max(2 * l2, 256 << 20)


class L2Flush:
    """Evicts the timed call's inputs from L2 before its start event.

    Writes a buffer of at least twice the L2 (the contract), then, with `clean`, reads a second
    one as large: the write leaves the L2 full of dirty lines, and their write-back to DRAM would
    otherwise land inside the timed call (about 60 MB on an H200, ~14 us at its bandwidth,
    charged to whatever runs next: measured in benchmarks/results, round 6).
    """

    def __init__(self, device: torch.device, nbytes: int, clean: bool = True):
        self.write = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.read = torch.zeros(nbytes, dtype=torch.uint8, device=device) if clean else None

    def __call__(self, value: int) -> None:
        self.write.fill_(value & 0x7F)
        if self.read is not None:
            self.read.max()  # a read-only kernel; its scalar result is discarded


def time_cuda(fn: Callable[[], Any], reps: int, warmup: int, flush: bool = True, clean: bool = True,
              spin_cycles: int = 400_000) -> list[int]:
    """Time `fn` in this process: events on the current stream, L2 flushed, ns per rep. Before
    the start event the GPU spins for `spin_cycles` (then flushes) so launch latency is hidden."""
    device = torch.device("cuda", torch.cuda.current_device())
    flusher = L2Flush(device, flush_bytes_for(device), clean) if flush else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        if flusher is not None:
            flusher(i)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(int(round(start.elapsed_time(end) * 1e6)))
    return out

