"""The GEMM ceiling (issue 31 item 4): the device library's own time for the matrix products a
protocol cannot avoid, measured by the validator in the same run as the implementation.

A fused linear + loss kernel cannot beat the GEMMs it must do: the FLOP floor from the datasheet's
dense tensor-core peak (floors.py) bounds it, but no library reaches that peak (cuBLAS on the H200:
~70%), so a ratio to the peak alone says little. Beside it, every timed protocol of an operation that
declares GEMMs (`Operation.gemms`) gets `gemm_ceiling`: torch.mm (cuBLAS) on operands of the
workload's shapes and dtype, each GEMM as the fused computation lays it out (a transposed operand
read as a transposed view), all of the protocol's GEMMs in one timed function, with the timed
protocol's own method (CUDA events, L2 flushed, median); and `gemm_ceiling_ratio` = the
implementation's median over the ceiling's. Measured in the parent, after the implementation's
calls of that protocol, on the same GPU: same clocks, no worker call in flight.

What a hostile worker could do: keep the GPU busy from a background process while the parent
measures, making the ceiling slower and its own ratio better. The ceiling is therefore checked
against the datasheet FLOP floor: one more than DISTURBED times that floor (cuBLAS reaches ~1.4x
on an H200) is reported `disturbed` without a ratio, never published as a flattering number.
Operands: a GEMM's time depends on its operands' values through the card's power draw (on an H100 the
seed-b2 workload's first GEMM took 1.049x as long on the workload's own drawn operands as on N(0, 1) x 0.02,
docs/fused-kernel.md, "The epilogue forward in the folder"), so each operand an input holds (`Gemm.operands`)
takes the values the implementation's timed calls were given: the parent's pristine copy of the first timed
buffer set, which no worker maps (a worker that wrote its shared inputs to slow the library down would reach
nothing here). An operand no input holds (an intermediate the implementation forms) is drawn, N(0, 1) x 0.02
in its dtype (zeros could be short-cut by sparsity-aware hardware). `operands` in the result says which was
which. Out of memory: reported as not measured, the run goes on.
Layouts: one GEMM over all rows is not the library's fastest way to those FLOPs. On an H200 the
seed-b16 fused operation's first GEMM took 27.2-28.0 ms whole on the workload's values, while a 2048-row
piece took ~3.04 ms (~24.3 ms for eight; two calls of one session: docs/fused-kernel.md, "Whole GEMMs
against chunks of rows"), so a kernel that chunks its rows (ours does) read under 1x a ceiling that was no
ceiling. So each GEMM is first timed alone, whole and split along its rows dimension (`Gemm.rows`: output
rows for "m"; for "k" the summed dimension, each piece added into the output as a chunked kernel adds it) in
pieces of `row_chunks` rows; the ceiling then times every GEMM in its own fastest layout, back to back, as
one function. `layout` in the result names each GEMM's layout, `layouts` each GEMM's medians alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from grpo_conform.ops.interface import Gemm
from grpo_conform.timing import METHOD, Distribution, time_cuda

DISTURBED = 3.0  # a ceiling slower than this many times the datasheet FLOP floor was not measured alone


@dataclass(frozen=True)
class CeilingSettings:
    reps: int = 10
    warmup: int = 2
    row_chunks: tuple[int, ...] = (2048, 4096)  # rows per piece of the split layouts (docstring: Layouts)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """cuda:0 and cuda are the same device where the run names no index."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _operands(g: Gemm, device: torch.device, values: Mapping[str, torch.Tensor] | None = None
              ) -> tuple[tuple[torch.Tensor, torch.Tensor], list[str]]:
    """(a, b) and where each came from: the timed input named by `g.operands` where `values` holds it with
    the operand's element count and dtype on this device, else drawn."""
    dtype = getattr(torch, g.dtype)
    gen = torch.Generator(device=device).manual_seed(0x6E33)

    def operand(name: str, rows: int, cols: int, transposed: bool) -> tuple[torch.Tensor, str]:
        shape = (cols, rows) if transposed else (rows, cols)
        t = (values or {}).get(name) if name else None
        if t is not None and t.numel() == rows * cols and t.dtype == dtype and _same_device(t.device, device):
            t = t.reshape(shape)  # the parent's pristine copy: no worker can write it (docstring)
            source = name
        else:
            # drawn in its dtype: a float32 copy of the largest operand (16384 x 128256 at seed-b16) is 8.4 GB
            t = torch.randn(shape, generator=gen, device=device, dtype=dtype).mul_(0.02)
            source = "drawn"
        return (t.t() if transposed else t), source  # a transposed view, as the fused computation reads it

    (a, sa), (b, sb) = (operand(g.operands[0], g.m, g.k, g.transposed == "a"),
                        operand(g.operands[1], g.k, g.n, g.transposed == "b"))
    return (a, b), [sa, sb]


def _pieces(size: int, rows: int | None) -> list[tuple[int, int]]:
    """[start, stop) of each piece of `rows` along a dimension of `size` (one piece: the whole GEMM)."""
    step = size if not rows or rows >= size else rows
    return [(i, min(i + step, size)) for i in range(0, size, step)]


def _runner(gemms: Sequence[Gemm], pairs, outs, rows: Sequence[int | None]) -> Callable[[], None]:
    """All of `gemms` in one function, each whole (its `rows` None) or in pieces of that many rows along
    `Gemm.rows`: "m" pieces write their own output rows, "k" pieces add into the whole output (the first sets it)."""
    steps: list[Callable[[], Any]] = []
    for g, (a, b), out, r in zip(gemms, pairs, outs, rows):
        axis = g.rows if r else ""
        if axis == "m":
            steps += [lambda a=a[i:j], b=b, o=out[i:j]: torch.mm(a, b, out=o) for i, j in _pieces(g.m, r)]
        elif axis == "k":
            for n, (i, j) in enumerate(_pieces(g.k, r)):
                steps.append((lambda a=a[:, i:j], b=b[i:j], o=out: torch.mm(a, b, out=o)) if n == 0 else
                             (lambda a=a[:, i:j], b=b[i:j], o=out: o.addmm_(a, b)))
        else:
            steps.append(lambda a=a, b=b, o=out: torch.mm(a, b, out=o))

    def run() -> None:
        for step in steps:
            step()

    return run


def _layouts(g: Gemm, settings: CeilingSettings) -> list[int | None]:
    """None (the GEMM whole), then each piece size that splits it."""
    size = {"m": g.m, "k": g.k}.get(g.rows, 0)
    return [None] + [r for r in settings.row_chunks if size > r]


def _name(rows: int | None) -> str:
    return "whole" if rows is None else f"rows of {rows}"


def _buffers(gemms: Sequence[Gemm], device: torch.device, values: Mapping[str, torch.Tensor] | None
             ) -> tuple[list, list[torch.Tensor], list[list[str]]]:
    """Each GEMM's operands (and where they came from) and output, shared by every layout timed."""
    made = [_operands(g, device, values) for g in gemms]
    outs = [torch.empty(g.m, g.n, device=device, dtype=getattr(torch, g.dtype)) for g in gemms]
    return [m[0] for m in made], outs, [m[1] for m in made]


def _time_cpu(fn: Callable[[], None], reps: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - start)
    return out


def measure(gemms: Sequence[Gemm], device: torch.device, settings: CeilingSettings = CeilingSettings(),
            flop_floor_ns: int | None = None, values: Mapping[str, torch.Tensor] | None = None
            ) -> dict[str, Any] | None:
    """The ceiling of `gemms` on `device` (JSON-ready), or None when there are none; `values`: the timed
    inputs (the parent's pristine copies) whose values the GEMMs' named operands take. On the CPU (the tests)
    a perf_counter loop stands in for CUDA events."""
    if not gemms:
        return None
    base = {"gemms": [g.to_json() for g in gemms], "flops": sum(g.flops for g in gemms),
            "library": "torch.mm (cuBLAS)" if device.type == "cuda" else "torch.mm (CPU BLAS)"}
    method = METHOD if device.type == "cuda" else "perf_counter_ns per rep, no cache flush (CPU)"

    def timed(fn: Callable[[], None]) -> Distribution:
        if device.type == "cuda":
            return Distribution.of(time_cuda(fn, settings.reps, settings.warmup))
        return Distribution.of(_time_cpu(fn, settings.reps, settings.warmup))

    try:
        pairs, outs, sources = _buffers(gemms, device, values)
        alone: list[dict[str, int]] = []  # per GEMM: each layout's median, the GEMM timed alone
        chosen: list[int | None] = []
        for g, pair, o in zip(gemms, pairs, outs):
            dists = {r: timed(_runner([g], [pair], [o], [r])) for r in _layouts(g, settings)}
            chosen.append(min(dists, key=lambda r: dists[r].median_ns))  # this GEMM's fastest layout
            alone.append({_name(r): d.median_ns for r, d in dists.items()})
        # the ceiling: every GEMM in its fastest layout, back to back in one timed function
        dist = dists[chosen[0]] if len(gemms) == 1 else timed(_runner(gemms, pairs, outs, chosen))
    except torch.cuda.OutOfMemoryError as exc:
        return base | {"measured": False, "reason": f"out of memory on {device}: {str(exc)[:200]}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out = base | {"measured": True, "method": method, "reps": settings.reps, "warmup": settings.warmup,
                  "event": dist.to_json(), "median_ns": dist.median_ns, "operands": sources,
                  "layout": [_name(r) for r in chosen], "layouts": alone}
    if flop_floor_ns:
        out["vs_flop_floor"] = round(dist.median_ns / flop_floor_ns, 4)
        out["disturbed"] = dist.median_ns > DISTURBED * flop_floor_ns
    return out


def attach(result: dict[str, Any], ceiling: dict[str, Any] | None) -> None:
    """Put `ceiling` into a timed protocol's result with its ratio (the result's median over the
    ceiling's), unless it was not measured or was disturbed."""
    if ceiling is None:
        return
    result["gemm_ceiling"] = ceiling
    if ceiling.get("measured") and not ceiling.get("disturbed") and ceiling.get("median_ns"):
        result["gemm_ceiling_ratio"] = round(result["event"]["median_ns"] / ceiling["median_ns"], 4)
