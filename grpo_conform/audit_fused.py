"""Reported rows that timed the fused lm_head + GRPO loss, judged as what they timed (issue 31, item 7).

Liger-Kernel's `fused_linear_grpo_loss*` rows time `LigerFusedLinearGRPOLoss` (and a torch eager
baseline): hidden states [B, T, H] times the lm_head weight [V, H], then the loss. Such a row is
judged against the fused spec (`grpo-fused-linear`, member token-is by default), never against the
spec over given log-probability inputs: its workload gains the hidden size (`H` in Liger's config),
its floor is the fused operation's (max of DRAM and tensor-core FLOPs per protocol, floors.py), and
its protocol is named for what it is.

Decision: the floor of Liger's backward-only protocol (`accumulation-v1`). Liger's benchmark
(benchmark/scripts/benchmark_grpo_loss.py, Liger-Kernel PR #845) runs one untimed forward, then
times `y.backward(retain_graph=True)` with `grad_to_none=[_input]`: the hidden states' gradient is
reset between calls, the weight's is not. `LigerFusedLinearGRPOLoss` computes d hidden and d weight
inside its forward and saves them; its backward hands them back. So what a timed call must do is
autograd's accumulation of an already-computed weight gradient into a `weight.grad` that already
holds one (the warm-up calls filled it): read the stored gradient, read weight.grad, write
weight.grad, each V x H elements in the weight's dtype: 3 x V x H x itemsize bytes over the
datasheet bandwidth. Nothing else is counted: the hidden gradient's `.grad` is empty on every call,
so autograd may hand the stored tensor over without a copy, and the loss and its inputs need not be
touched. That floor is a lower bound for any implementation under this protocol (one that computes
its gradients in backward, as the torch baseline does, needs more, not less); it bounds nothing about
the loss, so a backward-only time is never shown as the loss's time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from grpo_conform.audit_model import Finding, Record, RecordAudit, match_workload
from grpo_conform.floors import (ITEMSIZE, TRAFFIC, Floor, FloorError, Traffic, below_floor, compute_floor,
                                 format_ns, ratio)
from grpo_conform.hardware import Catalogue, GpuSpec
from grpo_conform.spec import ResolvedWorkload, Spec

DEFAULT_FUSED_SPEC = "grpo-fused-linear/token-is"
ACCUMULATION = "accumulation-v1"
#: Liger-Kernel's benchmark names of the fused kernel -> the importance-sampling level the name states
FUSED_NAMES: dict[str, Optional[str]] = {"fused_linear_grpo_loss": None, "fused_linear_grpo_loss_token": "token",
                                         "fused_linear_grpo_loss_sequence": "sequence"}
LEVEL_KEY = "importance_sampling_level"  # Liger's config key (PR #845)
PROTOCOL_TEXT = "backward after an untimed forward with retain_graph"
#: provider -> what the backward-only protocol times for it (read in Liger-Kernel 0.6.1's sources)
PROVIDER_BACKWARD = {
    "liger": "the gradients were computed in the forward; this times the accumulation into weight.grad",
    "torch": "torch eager computes its gradients in this backward (d of the loss, then the d hidden and d weight "
             "GEMMs), then accumulates into weight.grad: the gradient work without the forward's",
}
UNKNOWN_PROVIDER = ("what this backward does depends on the implementation (a fused kernel that computes its "
                    "gradients in the forward leaves only the accumulation into weight.grad)")
SETTINGS = ("Liger's benchmark ran it with beta 0.1, a reference lm_head (a second GEMM) and loss_type bnpo; "
            "the member's work is a part of that work, so its floor bounds it from below")


def normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def is_fused(record: Record) -> bool:
    """True for a row whose operation is one of Liger's names of the fused lm_head + GRPO loss."""
    return normalise(record.operation) in FUSED_NAMES


def stated_level(record: Record) -> tuple[Optional[str], str]:
    """(importance-sampling level the row states, where it states it), or (None, '') when it does not."""
    level = record.extra.get(LEVEL_KEY)
    if isinstance(level, str) and level:
        return level, f"its config's {LEVEL_KEY}"
    named = FUSED_NAMES.get(normalise(record.operation))
    return (named, f"its name {record.operation!r}") if named else (None, "")


def protocol_text(record: Record) -> str:
    """The backward-only protocol in words, with what it times for this row's provider."""
    return f"{PROTOCOL_TEXT}: {PROVIDER_BACKWARD.get(record.implementation.strip().lower(), UNKNOWN_PROVIDER)}"


def accumulation_floor(resolved: ResolvedWorkload, gpu: GpuSpec) -> Floor:
    """accumulation-v1 (module docstring): weight.grad += the stored gradient, 3 x V x H x itemsize bytes."""
    shape = tuple(resolved.shapes["weight"])
    dtype = resolved.dtypes.get("weight", "bfloat16")
    size = math.prod(shape) * ITEMSIZE[dtype]
    traffic = (Traffic("stored d weight", "gradient", "read", shape, dtype, size, 0, "computed in the forward"),
               Traffic("weight.grad", "gradient", "read", shape, dtype, size, 0, "holds the earlier calls' sum"),
               Traffic("weight.grad", "gradient", "write", shape, dtype, size, 0, "the sum"))
    dram = math.floor(3 * size / gpu.dram_bytes_per_s * 1e9)
    lines = (f"{ACCUMULATION}: the backward-only protocol after a forward that computed the gradients: "
             "weight.grad += stored d weight (hidden's .grad is reset between calls: no copy needed)",
             *(f"  {t.direction} {t.tensor} {t.dtype} {list(t.shape)}: {t.bytes:,} B; {t.note}" for t in traffic),
             f"dram: {3 * size:,} B / {gpu.dram_gbps:,.0f} GB/s ({gpu.name} datasheet) = {format_ns(dram)}",
             "no FLOP floor: an addition per element, no GEMM")
    return Floor("backward", resolved.name, gpu.name, True, 2 * size, size, 0, 0, dram, None, None, "dram", dram,
                 dram, traffic, lines, ACCUMULATION)


def _with_hidden(record: Record, spec: Spec) -> Record:
    """The row with Liger's `H` as the spec's hidden axis, axes in the spec's order; the level is read apart."""
    axes = dict(record.axes)
    extra = {k: v for k, v in record.extra.items() if k != LEVEL_KEY}
    if isinstance(extra.get("H"), int):
        axes["hidden"] = extra.pop("H")
    order = [a.name for a in spec.axes]
    axes = {a: axes[a] for a in order if a in axes} | {a: v for a, v in axes.items() if a not in order}
    return dataclasses.replace(record, axes=axes, extra=extra)


def _operation(record: Record, spec: Spec, level: Optional[str], where: str) -> Finding:
    what = f"{record.operation!r} is the fused lm_head + GRPO loss, the operation of {spec.id}"
    if level == "sequence":
        return Finding("operation", "mismatch", f"{what}, at sequence-level importance sampling (GSPO, stated by "
                       f"{where}): not the {spec.member or spec.id} member's token-level semantics")
    if level == "token":
        return Finding("operation", "ok", f"{what}, token level (stated by {where}); {SETTINGS}")
    return Finding("operation", "warning", f"{what}; the row does not state its importance-sampling level (the "
                   f"older name: token or sequence, see the source-row finding); {SETTINGS}")


def _physics(record: Record, spec: Spec, workload, gpu: GpuSpec) -> tuple[Finding, Optional[Floor]]:
    resolved = spec.resolve(workload)
    if record.protocol == "backward":
        floor = accumulation_floor(resolved, gpu)
        what = f"the backward-only floor ({ACCUMULATION}: the accumulation into weight.grad"
    elif record.protocol in ("forward", "full"):
        try:
            floor = compute_floor(spec, resolved, record.protocol, gpu, model=TRAFFIC)
        except FloorError as exc:
            return Finding("physics", "skipped", str(exc)), None
        what = f"the {record.protocol} floor ({TRAFFIC} bytes and the GEMMs' FLOPs, {floor.binding} binds"
    else:
        return Finding("physics", "skipped", f"no floor for protocol {record.protocol!r}"), None
    time_ns = record.median_ms * 1e6
    where = f"{format_ns(floor.floor_ns)} on {gpu.name})"
    if below_floor(time_ns, floor):
        return Finding("physics", "impossible", f"{record.median_ms:g} ms is below {what}, {where}: strict bound "
                       f"{format_ns(floor.strict_ns)}"), floor
    return Finding("physics", "ok", f"{ratio(time_ns, floor):.2f}x {what}, {where}: physically possible"), floor


def audit_fused_record(record: Record, spec: Spec, catalogue: Catalogue,
                       source_row: Optional[Finding] = None) -> RecordAudit:
    """The row judged against the fused spec; `source_row`: what Liger's own CSV says of it (audit_against.py)."""
    level, where = stated_level(record)
    record = _with_hidden(record, spec)
    match = catalogue.lookup(record.gpu)
    findings = [Finding("gpu", "unknown", f"{record.gpu!r} is not in the GPU catalogue") if match is None else
                Finding("gpu", "warning" if match.note else "ok", match.note or match.gpu.name),
                _operation(record, spec, level, where)]
    if record.protocol == "backward":
        findings.append(Finding("protocol", "mismatch", f"backward-only protocol: {protocol_text(record)}; never a "
                                "headline time of the loss (that is the full protocol's)"))
    elif record.protocol in ("forward", "full"):
        findings.append(Finding("protocol", "ok", f"times the {record.protocol!r} protocol"))
    else:
        findings.append(Finding("protocol", "mismatch", f"{record.protocol!r} is not a protocol of this project"))
    wl_finding, workload = match_workload(record, spec)
    findings.append(wl_finding)
    if source_row is not None:
        findings.append(source_row)
    floor = None
    if match is None or workload is None:
        findings.append(Finding("physics", "skipped", "no datasheet floor without a known GPU and a full workload"))
    else:
        physics, floor = _physics(record, spec, workload, match.gpu)
        findings.append(physics)
    status = {f.check: f.status for f in findings}
    comparable = "mismatch" not in (status["operation"], status["protocol"], status["workload"],
                                    status.get("source-row"))
    verdict = "impossible" if status["physics"] == "impossible" else ("unknown-gpu" if match is None else "plausible")
    floor_ratio = ratio(record.median_ms * 1e6, floor) if floor is not None and floor.floor_ns else None
    summary = f"{record.implementation} timed the fused-linear operation ({spec.id}: hidden x lm_head weight, then " \
              "the GRPO loss)" + (f" under the backward-only protocol: {protocol_text(record)}; never a headline "
                                  "time of the loss" if record.protocol == "backward" else
                                  f" under the {record.protocol} protocol")
    return RecordAudit(record, verdict, tuple(findings), comparable, match,
                       workload.name if workload is not None and workload.name != "reported" else None, floor,
                       floor_ratio, spec.id, summary)
