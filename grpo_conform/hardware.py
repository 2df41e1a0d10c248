"""What the GPU can do: datasheet peaks from the catalogue (data/gpus.json) and measured ceilings.

The catalogue is data, validated into frozen models; a name (a torch device name such as
"NVIDIA A100-SXM4-80GB" or a human one such as "h100 sxm") resolves through each entry's match
patterns. A name that fits several variants equally well resolves to the fastest of them, with a
note: a floor built on it must stay a lower bound. `measure_ceilings` times a large copy and a
read-only reduction on the running CUDA device; `describe_running_gpu` puts both together and
works for a GPU the catalogue does not know (measured figures only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from grpo_conform import data
from grpo_conform.timing import time_cuda
from grpo_conform.errors import EXIT_USAGE, EnvironmentProblem, GrpoConformError

CATALOGUE_FORMAT = "grpo-conform-gpus/1"
_DROPPED_WORDS = frozenset({"nvidia", "amd", "geforce", "tesla", "instinct", "gpu", "graphics"})


class CatalogueError(GrpoConformError):
    """The GPU catalogue file is unreadable or an entry breaks its rules."""

    def __init__(self, file: str | Path, where: str, problem: str):
        self.file, self.where, self.problem = str(file), where, problem
        super().__init__(f"{file}: at {where}: {problem}")


class UnknownGpu(GrpoConformError):
    exit_code = EXIT_USAGE


def name_tokens(text: str) -> frozenset[str]:
    """'NVIDIA A100-SXM4-80GB' -> {a100, sxm4, 80gb}; vendor words dropped, '80 GB' joined to '80gb'."""
    lowered = re.sub(r"(\d+)\s*gb\b", r"\1gb", text.lower())
    return frozenset(t for t in re.split(r"[^a-z0-9]+", lowered) if t and t not in _DROPPED_WORDS)


class GpuSpec(BaseModel):
    """One catalogue entry: datasheet figures, where they come from, and how names match it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd"]
    architecture: str
    compute_capability: Optional[str] = None
    form_factor: str
    match: tuple[str, ...] = Field(min_length=1)
    exclude: tuple[str, ...] = ()
    dram_gbps: float = Field(gt=0)
    memory_gb: float = Field(gt=0)
    memory_type: str
    cache_mib: float = Field(gt=0)
    cache_level: str = "L2"
    compute_units: int = Field(gt=0)
    compute_unit: Literal["SM", "CU"]
    boost_clock_mhz: int = Field(gt=0)
    exp_per_clock_per_unit: int = Field(gt=0)
    exp_basis: str = Field(min_length=10)
    source: str
    notes: str = ""
    # Dense tensor-core peaks per GEMM operand dtype (TFLOPS; structured sparsity not counted), for the
    # FLOP floor of operations with matrix products; a dtype without one gets no FLOP floor.
    tensor_tflops: dict[Literal["bfloat16", "float16"], float] = {}
    tensor_basis: str = ""

    @model_validator(mode="after")
    def _peaks_have_a_source(self) -> "GpuSpec":
        if self.tensor_tflops and len(self.tensor_basis) < 10:
            raise ValueError("tensor_tflops needs tensor_basis: where the peaks come from")
        return self

    @field_validator("source")
    @classmethod
    def _source_is_a_url(cls, value: str) -> str:
        if not re.match(r"^https://\S+$", value):
            raise ValueError("must be the https:// URL of the vendor page the figures come from")
        return value

    @field_validator("match")
    @classmethod
    def _patterns_have_tokens(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if not name_tokens(pattern):
                raise ValueError(f"pattern {pattern!r} has no name tokens left after dropping vendor words")
        return value

    @property
    def dram_bytes_per_s(self) -> float:
        return self.dram_gbps * 1e9

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mib * 2**20)

    @property
    def exp_per_s(self) -> float:
        return self.compute_units * self.exp_per_clock_per_unit * self.boost_clock_mhz * 1e6

    def flops_per_s(self, dtype: str) -> Optional[float]:
        """Dense tensor-core FLOP/s for GEMM operands of `dtype`; None when the catalogue has no peak."""
        tflops = self.tensor_tflops.get(dtype)
        return tflops * 1e12 if tflops else None

    def score(self, tokens: frozenset[str]) -> int:
        """Tokens of the most specific pattern contained in `tokens`; 0 when none fits or excluded."""
        if tokens & {e.lower() for e in self.exclude}:
            return 0
        return max((len(p) for p in map(name_tokens, self.match) if p <= tokens), default=0)

    def datasheet_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"match", "exclude"})


@dataclass(frozen=True)
class GpuMatch:
    """How a name resolved: the entry used, the equally good candidates, and a note when ambiguous."""

    query: str
    gpu: GpuSpec
    candidates: tuple[str, ...]
    note: Optional[str] = None

    @property
    def ambiguous(self) -> bool:
        return len(self.candidates) > 1

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "id": self.gpu.id, "name": self.gpu.name,
                "candidates": list(self.candidates), "note": self.note}


class Catalogue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["grpo-conform-gpus/1"]
    description: str = ""
    gpus: tuple[GpuSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> "Catalogue":
        seen: set[str] = set()
        for gpu in self.gpus:
            if gpu.id in seen:
                raise ValueError(f"duplicate GPU id {gpu.id!r}")
            seen.add(gpu.id)
        return self

    def get(self, gpu_id: str) -> GpuSpec:
        return next(g for g in self.gpus if g.id == gpu_id)

    def known(self) -> str:
        return ", ".join(f"{g.name} ({g.id})" for g in self.gpus)

    def lookup(self, name: str) -> Optional[GpuMatch]:
        """Resolve a name, or None when no entry fits it."""
        by_id = [g for g in self.gpus if g.id == name.strip().lower()]
        if by_id:
            return GpuMatch(name, by_id[0], (by_id[0].id,))
        tokens = name_tokens(name)
        scored = [(g.score(tokens), g) for g in self.gpus]
        best = max((s for s, _ in scored), default=0)
        if best == 0:
            return None
        top = [g for s, g in scored if s == best]
        chosen = max(top, key=lambda g: (g.dram_gbps, g.exp_per_s))
        note = None
        if len(top) > 1:
            names = [g.name for g in sorted(top, key=lambda g: -g.dram_gbps)]
            listed = ", ".join(names[:-1]) + " and " + names[-1]
            note = (f"{name!r} does not say which variant: it matches {listed}; using the "
                    f"fastest, {chosen.name} ({chosen.dram_gbps:,.0f} GB/s), so the floor stays a lower bound. "
                    f"Name the variant (e.g. its torch device name) for a tighter floor.")
        return GpuMatch(name, chosen, tuple(g.id for g in top), note)

    def resolve(self, name: str) -> GpuMatch:
        """Like `lookup`, but an unknown name is an error that lists the known GPUs."""
        found = self.lookup(name)
        if found is None:
            raise UnknownGpu(f"unknown GPU {name!r}: it matches no entry of the GPU catalogue. Known GPUs: "
                             f"{self.known()}. Pass one of these names or ids, or add an entry to "
                             f"{data.data_path(data.GPUS_FILE)} (see docs/floors.md).")
        return found


def parse_catalogue(doc: Any, file: str | Path = "<catalogue>") -> Catalogue:
    try:
        return Catalogue.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = list(first["loc"])
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        if len(loc) >= 2 and loc[0] == "gpus" and isinstance(loc[1], int) and isinstance(doc, dict):
            try:
                where += f" (entry {doc['gpus'][loc[1]].get('id', '?')!r})"
            except (KeyError, IndexError, TypeError, AttributeError):
                pass
        raise CatalogueError(file, where, first["msg"]) from None


def load_catalogue(path: str | Path | None = None) -> Catalogue:
    """The packaged catalogue (cached), or the one at `path`."""
    if path is None:
        return _default_catalogue()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogueError(path, "$", f"cannot read the file: {exc.strerror}") from None
    return _parse_text(text, path)


@lru_cache(maxsize=1)
def _default_catalogue() -> Catalogue:
    return _parse_text(data.read_text(data.GPUS_FILE), data.data_path(data.GPUS_FILE))


def _parse_text(text: str, file: str | Path) -> Catalogue:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogueError(file, f"line {exc.lineno} column {exc.colno}", f"not valid JSON: {exc.msg}") from None
    return parse_catalogue(doc, file)


# -- measured ceilings --------------------------------------------------------------------------
Timer = Callable[[Callable[[], object], int, int], Sequence[int]]
DEFAULT_REPS = 30
DEFAULT_WARMUP = 5
MIN_BUFFER_BYTES = 4 * 2**30  # on an H200 4 GiB read 1% faster than 2 GiB (launch cost amortized)
MAX_BUFFER_BYTES = 8 * 2**30
L2_MULTIPLE = 16


def quantile(sorted_ns: Sequence[int], q: float) -> int:
    """Linear-interpolated quantile of sorted integers, rounded to an integer."""
    pos = q * (len(sorted_ns) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ns) - 1)
    return round(sorted_ns[lo] + (sorted_ns[hi] - sorted_ns[lo]) * (pos - lo))


@dataclass(frozen=True)
class StreamMeasurement:
    """One streaming kernel timed `reps` times after `warmup` untimed runs."""

    kind: Literal["copy", "read"]
    method: str
    buffer_bytes: int
    bytes_per_rep: int  # bytes crossing DRAM per repetition (a copy counts read + written)
    reps: int
    warmup: int
    samples_ns: tuple[int, ...]

    def _q(self, q: float) -> int:
        return quantile(sorted(self.samples_ns), q)

    @property
    def median_ns(self) -> int:
        return self._q(0.5)

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_per_rep * 1e9 / self.median_ns

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "method": self.method, "buffer_bytes": self.buffer_bytes,
                "bytes_per_rep": self.bytes_per_rep, "reps": self.reps, "warmup": self.warmup,
                "median_ns": self.median_ns, "p10_ns": self._q(0.1), "p90_ns": self._q(0.9),
                "min_ns": min(self.samples_ns), "max_ns": max(self.samples_ns),
                "bytes_per_s": self.bytes_per_s, "samples_ns": list(self.samples_ns)}


@dataclass(frozen=True)
class Ceilings:
    """Bandwidths this GPU actually reached: copy (bytes read + written) and read-only."""

    device_name: str
    copy_bytes_per_s: float
    read_bytes_per_s: float
    copy: Optional[StreamMeasurement] = None
    read: Optional[StreamMeasurement] = None
    timer: str = ""
    note: str = ""

    @classmethod
    def from_measurements(cls, device_name: str, copy: StreamMeasurement, read: StreamMeasurement,
                          timer: str) -> "Ceilings":
        return cls(device_name, copy.bytes_per_s, read.bytes_per_s, copy, read, timer)

    def to_json(self) -> dict[str, Any]:
        return {"device_name": self.device_name, "copy_bytes_per_s": self.copy_bytes_per_s,
                "read_bytes_per_s": self.read_bytes_per_s, "timer": self.timer, "note": self.note,
                "copy": self.copy.to_json() if self.copy else None,
                "read": self.read.to_json() if self.read else None}


def plan_buffer_bytes(l2_bytes: int, free_bytes: int) -> int:
    """Source buffer size: max(4 GiB, 16 x L2) capped at 8 GiB; two of them must fit in 80% of free memory."""
    want = min(max(MIN_BUFFER_BYTES, L2_MULTIPLE * l2_bytes), max(MAX_BUFFER_BYTES, 4 * l2_bytes))
    size = min(want, int(free_bytes * 0.4))
    size -= size % 2**20
    if size < 4 * l2_bytes or size <= 0:
        raise EnvironmentProblem(f"measuring bandwidth needs two buffers of at least 4 x L2 ({4 * l2_bytes:,} B "
                                 f"each) but only {free_bytes:,} B of GPU memory are free; free memory and retry")
    return size


def measure_streams(copy_fn: Callable[[], object], read_fn: Callable[[], object], buffer_bytes: int, *,
                    device_name: str, timer: Timer, timer_name: str, reps: int = DEFAULT_REPS,
                    warmup: int = DEFAULT_WARMUP) -> Ceilings:
    """Time the two kernels with `timer(fn, reps, warmup) -> ns per rep` and derive the ceilings."""
    if reps < 3 or warmup < 0:
        raise GrpoConformError(f"reps must be >= 3 and warmup >= 0 (got reps={reps}, warmup={warmup})")
    runs = []
    for kind, fn, moved, how in (
        ("copy", copy_fn, 2 * buffer_bytes, "device-to-device copy of a bf16 buffer; bytes = read + written"),
        ("read", read_fn, buffer_bytes, "sum of a bf16 buffer into one fp32 value; bytes = read"),
    ):
        samples = tuple(int(s) for s in timer(fn, reps, warmup))
        if len(samples) != reps or min(samples) <= 0:
            raise GrpoConformError(f"the {timer_name} timer returned {len(samples)} samples (expected {reps}, all > 0)")
        runs.append(StreamMeasurement(kind, how, buffer_bytes, moved, reps, warmup, samples))  # type: ignore[arg-type]
    return Ceilings.from_measurements(device_name, runs[0], runs[1], timer_name)


def _cuda_device(device: Any):
    """`device` as a torch CUDA device, or an EnvironmentProblem saying why it cannot be one."""
    import torch  # only where a GPU is measured: floors and `spec` commands stay torch-free

    dev = torch.device(device)
    if dev.type != "cuda":
        raise EnvironmentProblem(f"measuring bandwidth needs a CUDA device, not {dev.type!r}")
    if not torch.cuda.is_available():
        raise EnvironmentProblem("no CUDA device is available (torch.cuda.is_available() is False)")
    return dev


def measure_ceilings(device: Any = "cuda", *, buffer_bytes: int | None = None, reps: int = DEFAULT_REPS,
                     warmup: int = DEFAULT_WARMUP, timer: Timer | None = None) -> Ceilings:
    """Copy and read bandwidth of the CUDA `device` over buffers several times its L2."""
    import torch  # only where a GPU is measured: floors and `spec` commands stay torch-free

    dev = _cuda_device(device)
    props = torch.cuda.get_device_properties(dev)
    free, _total = torch.cuda.mem_get_info(dev)
    size = buffer_bytes or plan_buffer_bytes(int(props.L2_cache_size), int(free))
    timer_fn, timer_name = ((timer, getattr(timer, "__name__", "injected")) if timer
                            else (time_cuda, "grpo_conform.timing.time_cuda (CUDA events, L2 flushed)"))
    src = torch.empty(size // 2, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    dst = torch.empty_like(src)
    try:
        return measure_streams(lambda: dst.copy_(src), lambda: torch.sum(src, dtype=torch.float32),
                               src.numel() * 2, device_name=props.name, timer=timer_fn, timer_name=timer_name,
                               reps=reps, warmup=warmup)
    finally:
        del src, dst
        torch.cuda.empty_cache()


# -- the running GPU ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunningGpu:
    """The GPU a run used: its catalogue entry when known, its own properties, measured ceilings."""

    device_name: str
    match: Optional[GpuMatch]
    properties: dict[str, Any] = field(default_factory=dict)
    ceilings: Optional[Ceilings] = None
    notes: tuple[str, ...] = ()

    @property
    def gpu(self) -> Optional[GpuSpec]:
        return self.match.gpu if self.match else None

    def to_json(self) -> dict[str, Any]:
        return {"device_name": self.device_name, "catalogue": self.gpu.datasheet_json() if self.gpu else None,
                "match": self.match.to_json() if self.match else None, "properties": self.properties,
                "ceilings": self.ceilings.to_json() if self.ceilings else None, "notes": list(self.notes)}


def describe_gpu(device_name: str, properties: dict[str, Any] | None = None, ceilings: Ceilings | None = None,
                 catalogue: Catalogue | None = None) -> RunningGpu:
    """Pure part of `describe_running_gpu`: never raises for a GPU the catalogue does not know."""
    properties = dict(properties or {})
    match = (catalogue or load_catalogue()).lookup(device_name)
    notes: list[str] = []
    if match is None:
        notes.append(f"{device_name!r} is not in the GPU catalogue: no datasheet floor; floors use measured "
                     "ceilings only")
    else:
        if match.note:
            notes.append(match.note)
        units = properties.get("multi_processor_count")
        if units is not None and units != match.gpu.compute_units:
            notes.append(f"the device reports {units} {match.gpu.compute_unit}s, the catalogue entry "
                         f"{match.gpu.compute_units} (a partition or another variant?)")
    return RunningGpu(device_name, match, properties, ceilings, tuple(notes))


def describe_running_gpu(device: Any = "cuda", ceilings: Ceilings | None = None,
                         catalogue: Catalogue | None = None) -> RunningGpu:
    import torch  # only where a GPU is measured: floors and `spec` commands stay torch-free

    dev = _cuda_device(device)
    p = torch.cuda.get_device_properties(dev)
    props = {"multi_processor_count": p.multi_processor_count, "total_memory_bytes": p.total_memory,
             "l2_cache_bytes": int(getattr(p, "L2_cache_size", 0)), "compute_capability": f"{p.major}.{p.minor}"}
    return describe_gpu(p.name, props, ceilings, catalogue)
