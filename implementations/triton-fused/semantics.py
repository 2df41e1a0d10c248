"""What a call computes (`Semantics`, from the spec's parameters) and how it is run (`FusedSettings`).

Semantics follow implementations/triton/plan.semantics_of for the members this folder claims (the
logits kernel's own module cannot be imported from here: vendored.py says why): loss types grpo,
bnpo, dr_grpo, dapo, cispo, sapo, luspo at token level; grpo, bnpo, dr_grpo, dapo, luspo at sequence
level (GSPO). The normaliser is a constant weight (norm 0) or one weight per sequence computed from the
mask before any GEMM (norm 1: grpo's 1 / (B max(1, n_b)); norm 2: bnpo's and dapo's 1 / max(1, N)).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping, Optional

TOKEN_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo")
SEQUENCE_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
DEFAULTS = dict(epsilon_low=0.2, epsilon_high=0.2, temperature=1.0, loss_type="grpo", importance_sampling_level="token",
                beta=0.0, max_completion_length=None, delta=None, num_items_in_batch=None, num_processes=1,
                use_bias_correction_kl=False, gradient_accumulation_steps=None, steps_per_generation=None,
                sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)


def _fp32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclass(frozen=True)
class Semantics:
    has_old: bool
    has_kl: bool
    has_mask: bool
    has_delta: bool
    cispo: bool
    sapo: bool
    kl_bc: bool
    sequence: bool
    norm: int  # 0: w_const; 1: per sequence (grpo); 2: over the batch (bnpo, dapo)
    w_const: float
    inv_temp: float  # 1 / T rounded to fp32, and the rest (the kernels form the differences in float64)
    inv_lo: float
    eps_low: float
    eps_high: float
    delta: float
    beta: float

    @property
    def needs_logp(self) -> bool:
        """Whether the loss reads the logits (token-is's ratio is exactly 1: its loss is a function of A)."""
        return self.has_old or self.has_kl or self.cispo or self.sequence

    def scalars(self) -> tuple:
        return (self.inv_temp, self.inv_lo, self.eps_low, self.eps_high, self.delta, self.beta, self.w_const)

    def switches(self) -> dict:
        return dict(HAS_OLD=self.has_old, HAS_KL=self.has_kl, HAS_MASK=self.has_mask, HAS_DELTA=self.has_delta,
                    CISPO=self.cispo, KL_BC=self.kl_bc, SAPO=self.sapo, PER_SEQ_W=self.norm != 0)


def semantics_of(batch: int, seq: int, *, has_old: bool, has_ref: bool, has_mask: bool,
                 parameters: Mapping[str, Any]) -> Semantics:
    unknown = set(parameters) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unsupported parameters for triton-fused: {sorted(unknown)}")
    p = {**DEFAULTS, **{k: v for k, v in parameters.items() if v is not None or k == "delta"}}
    loss_type, level = p["loss_type"], p["importance_sampling_level"]
    if level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence'; got {level!r}")
    sequence = level == "sequence"
    allowed = SEQUENCE_LOSS_TYPES if sequence else TOKEN_LOSS_TYPES
    if loss_type not in allowed:
        raise ValueError(f"loss_type={loss_type!r} is not implemented at {level} level (supported: {allowed})")
    if sequence and not has_old:
        raise ValueError("importance_sampling_level='sequence' needs old_logprobs")
    beta = float(p["beta"] or 0.0)
    if beta != 0.0 and not has_ref:
        raise ValueError("beta != 0 needs ref_logprobs [batch, seq] or ref_weight")
    kl_bc = bool(p["use_bias_correction_kl"]) and beta != 0.0
    if sequence and kl_bc:
        raise ValueError("importance_sampling_level='sequence' is implemented without the bias-corrected KL")
    temperature = float(p["temperature"])
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    norm, w_const = 0, 1.0 / (batch * max(1, seq))
    items = p["num_items_in_batch"]
    if loss_type == "dr_grpo":
        length = p["max_completion_length"]
        w_const = 1.0 / (batch * (max(1, seq) if length is None else int(length)))
    elif loss_type == "luspo":
        w_const = 1.0 / batch
    elif loss_type in ("dapo", "cispo") and items is not None:
        scale = max(1.0, float(items)) / float(p["num_processes"] or 1)
        if p["gradient_accumulation_steps"] is not None:
            accum = p["gradient_accumulation_steps"]
            steps = accum if p["steps_per_generation"] is None else p["steps_per_generation"]
            w_const = 1.0 / (scale * float(accum) / float(steps))
        else:
            w_const = 1.0 / max(1.0, float(items) / float(p["num_processes"] or 1))
    elif has_mask:
        norm = 1 if loss_type in ("grpo", "sapo") else 2
    eps_low, eps_high = float(p["epsilon_low"]), float(p["epsilon_high"])
    if loss_type == "sapo":  # the gate temperatures travel in the clip's scalars, as in implementations/triton
        eps_low, eps_high = float(p["sapo_temperature_pos"]), float(p["sapo_temperature_neg"])
    delta = p["delta"]
    return Semantics(has_old=has_old, has_kl=beta != 0.0, has_mask=has_mask, has_delta=delta is not None,
                     cispo=loss_type == "cispo", sapo=loss_type == "sapo", kl_bc=kl_bc, sequence=sequence, norm=norm,
                     w_const=w_const, inv_temp=_fp32(1.0 / temperature), inv_lo=1.0 / temperature - _fp32(1.0 / temperature),
                     eps_low=eps_low, eps_high=eps_high, delta=float(delta) if delta is not None else 0.0, beta=beta)


WEIGHT_GRAD_STRATEGIES = ("auto", "hold", "halves", "fp32")

# Rows per chunk where FusedSettings leaves them to the plan (docs/fused-kernel.md, "Chunk sizes").
# CHUNK_ROWS: calls that form gradients, hold or fp32 (round15s, round18e). HALVES_ROWS: the halves
# accumulator's GEMMs read and write all its float32 sums (4 V H bytes, both halves) once per chunk, so
# fewer, larger chunks move fewer bytes: fused_bench at batch 16 (device call round20a, fb16.log) measured 75.52 ms (0.970x the
# GEMMs) at 4096 rows against 77.52 ms (0.995x) at 2048, 2.08 against 1.59 GiB net (0.70x and 0.54x of
# Liger's 2.95). Capped at H rows: then one chunk of d logits (C V 2 bytes) is at most the float32 half
# (2 V H), and the halves path holds at most 4 V H bytes, as hold does where auto picks it.
# FORWARD_ROWS: forward-only calls hold no gradient buffers, but the same run timed the forward at
# 4096 rows no faster (28.41 and 30.13 ms) than at 2048 (27.61, 28.19, 28.99), so it keeps 2048.
CHUNK_ROWS = 2048
HALVES_ROWS = 4096
FORWARD_ROWS = 2048


@dataclass(frozen=True)
class FusedSettings:
    """How a call is run (docs/fused-kernel.md).

    chunk_rows: logits rows per chunk of a call that forms gradients (sequence-level members: rounded
    down to whole sequences, at least one); None: the plan's choice (HALVES_ROWS under the halves
    accumulator, capped at H and at least CHUNK_ROWS; CHUNK_ROWS otherwise). forward_rows: the same
    for forward-only calls (no gradient); None: chunk_rows where it is given, else FORWARD_ROWS.
    weight_grad: "hold" keeps d logits of every row (N x V in the weight's dtype) and
    forms d weight in one GEMM at the end; "fp32" accumulates d weight chunk by chunk into a V x H
    float32 buffer; "halves" accumulates the same float32 sums with rows [0, V/2) inside the returned
    gradient's own bytes (half of "fp32"'s extra memory; accumulator.py); "auto" holds while d logits
    take no more than 4 V H bytes, else "halves" (float32 weights always accumulate in place).
    split_elems / block / num_warps: the loss kernel's programs per row (a row is cut into pieces of
    split_elems, each a program that waits for its row's others; 0: one program per row), its loop
    step and warps. CPU and the interpreter always run one program per row. logits: "weight" (the
    GEMM rounds the logits to the weight's dtype, and d logits are written over them) or "float32"
    (cuBLAS writes float32 logits into a buffer of their own: half the rounding error of the loss
    terms at |z| ~ 8 in bf16 is gone, for one more chunk buffer in float32 and twice the loss
    kernel's reads). forward_sweep: how a forward-only call reads the logits (its one pass beyond the
    GEMM): "staged" (CUDA, rows on 16-byte boundaries: sweep.py's Gluon kernel, each row cut into chunks
    of forward_stage_bytes, one program each with every copy in flight, forward_stage_block elements a
    reduction step, forward_stage_warps warps; elsewhere "pipelined"), "pipelined" (the loss kernel
    itself, forward_block elements a step, forward_stages steps in flight per program, a running
    (max, sum) per lane, no L2 hint) or "plain" (the first sweep of a call that forms gradients: block
    elements a step, one in flight, each step reduced block-wide). Sequence-level members: "staged" or
    their plain statistics sweep. docs/fused-kernel.md, "Forward-only", has the measurements.
    forward_gemm: "epilogue" (a forward-only call of at most forward_epilogue_rows rows, bf16/fp16, on sm_90+
    or the interpreter: epilogue.py's persistent Triton GEMM leaves each row's statistics and target logit, no
    logits written, no sweep; forward_epilogue_tile is its (BM, BN, BK, stages, warps)) or "cublas" (cuBLAS
    writes the logits, forward_sweep reads them); where the epilogue cannot run, "cublas"."""

    chunk_rows: Optional[int] = None
    weight_grad: str = "auto"
    split_elems: int = 0  # one program per row: faster at every seed batch (docs/fused-kernel.md, "In place")
    block: int = 2048
    num_warps: int = 4
    logits: str = "weight"
    accumulate: str = "auto"  # the "fp32" strategy's GEMM: "auto" (cuBLAS where torch allows), "cublas", "triton"
    forward_rows: Optional[int] = None
    forward_sweep: str = "staged"
    forward_block: int = 1024
    forward_stages: int = 3
    forward_stage_bytes: int = 32768
    forward_stage_block: int = 2048
    forward_stage_warps: int = 4
    forward_gemm: str = "epilogue"
    forward_epilogue_rows: int = 4096  # above it, cuBLAS + the staged sweep measured faster (H100, b8: 1.065x)
    forward_epilogue_tile: tuple = (128, 256, 64, 3, 8)  # the best of epilogue_gemm.py's configs at b2 and b4

    def __post_init__(self):
        if self.weight_grad not in WEIGHT_GRAD_STRATEGIES:
            raise ValueError(f"weight_grad must be one of {WEIGHT_GRAD_STRATEGIES}; got {self.weight_grad!r}")
        if self.accumulate not in ("auto", "cublas", "triton"):
            raise ValueError(f"accumulate must be 'auto', 'cublas' or 'triton'; got {self.accumulate!r}")
        if self.logits not in ("weight", "float32"):
            raise ValueError(f"logits must be 'weight' or 'float32'; got {self.logits!r}")
        for rows in (self.chunk_rows, self.forward_rows):
            if rows is not None and rows < 1:
                raise ValueError(f"chunk_rows and forward_rows must be None or >= 1; got {rows}")
        for name in ("block", "forward_block"):
            b = getattr(self, name)
            if b < 16 or b & (b - 1):
                raise ValueError(f"{name} must be a power of two >= 16; got {b}")
        if self.forward_sweep not in ("staged", "pipelined", "plain") or self.forward_stages < 1:
            raise ValueError(f"forward_sweep must be 'staged', 'pipelined' or 'plain' and forward_stages >= 1; got "
                             f"{self.forward_sweep!r}, {self.forward_stages}")
        if self.forward_stage_warps not in (1, 2, 4, 8, 16) or self.forward_stage_bytes < 16 \
                or self.forward_stage_block < 16 or self.forward_stage_block & (self.forward_stage_block - 1):
            raise ValueError(f"forward_stage_warps must be a power of two <= 16, forward_stage_block a power of two "
                             f">= 16, forward_stage_bytes >= 16; got {self.forward_stage_warps}, "
                             f"{self.forward_stage_block}, {self.forward_stage_bytes}")

        if self.forward_gemm not in ("epilogue", "cublas") or self.forward_epilogue_rows < 0 \
                or len(self.forward_epilogue_tile) != 5 or any(
                    b < 16 or b & (b - 1) for b in self.forward_epilogue_tile[:3]):
            raise ValueError(f"forward_gemm must be 'epilogue' or 'cublas', forward_epilogue_rows >= 0, "
                             f"forward_epilogue_tile (BM, BN, BK, stages, warps) with powers of two >= 16; got "
                             f"{self.forward_gemm!r}, {self.forward_epilogue_rows}, {self.forward_epilogue_tile}")

    def rows(self, strategy: str, hidden: int) -> int:
        """Rows per chunk of a call that forms gradients with this weight-gradient strategy."""
        if self.chunk_rows is not None:
            return self.chunk_rows
        if strategy == "halves":
            return max(CHUNK_ROWS, min(HALVES_ROWS, hidden))
        return CHUNK_ROWS

    def rows_forward(self) -> int:
        """Rows per chunk of a forward-only call."""
        if self.forward_rows is not None:
            return self.forward_rows
        return self.chunk_rows if self.chunk_rows is not None else FORWARD_ROWS
