"""Compile implementations/triton-fused's kernels for sm_90 offline (no GPU), for every switch set its
launches use: each declared member's semantics (at the spec draft's defaults), bf16 and fp32 logits,
WRITE_GRAD on and off (off: the default forward-only sweep), one program per row and the split rows of the
default settings.
    python3 benchmarks/fused_compile.py                                   # the installed triton
    PYTHONPATH=/tmp/site36 python3 benchmarks/fused_compile.py            # the H200's triton 3.6
(`python3 -m pip install --no-deps --target /tmp/site36 triton==3.6.0` first, as benchmarks/
compile_staged.py says.) Prints one JSON line {case: shared bytes}; each case is named on stderr
before it compiles, so a failure names its case. Unit strides are passed as the constants the JIT makes of
them (the d weight GEMM pipelines only then: 128 KiB of shared memory at 128 x 256 x 64, 48 KiB without).
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parent.parent
DIV16 = {"vocab", "stride_x", "stride_g", "s_ak", "s_bk", "s_cm"}
FLOATS = {"inv_temp", "inv_lo", "eps_low", "eps_high", "delta", "beta", "w_const", "scale2"}
MEMBERS = {  # name: (has_old, has_ref, has_mask, parameters)
    "token-is": (False, False, False, {}),
    "token-offpolicy-mask": (True, False, True, {"loss_type": "grpo"}),
    "token-offpolicy-mask-kl": (True, True, True, {"loss_type": "grpo", "beta": 0.04}),
    "bnpo-mask": (True, False, True, {"loss_type": "bnpo"}),
    "dr-grpo-mask": (True, False, True, {"loss_type": "dr_grpo", "max_completion_length": 1024}),
    "dapo-mask": (True, False, True, {"loss_type": "dapo"}),
    "sequence-offpolicy-mask": (True, False, True, {"loss_type": "grpo", "importance_sampling_level": "sequence"}),
}


def load():
    pkg = types.ModuleType("fused_compile_pkg")
    pkg.__path__ = [str(ROOT / "implementations" / "triton-fused")]
    sys.modules[pkg.__name__] = pkg
    return [importlib.import_module(f"{pkg.__name__}.{m}") for m in ("kernels", "semantics")]


def compile_(case, fn, constexprs, ptrs, num_warps, num_stages=3):
    names = fn.arg_names
    sig = {n: "constexpr" if n in constexprs else ptrs.get(n, "*fp32" if n.endswith("_ptr") else
                                                          "fp32" if n in FLOATS else "i32") for n in names}
    # as the JIT specialises them at the seed shape: pointers and V-multiples divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in DIV16}
    src = ASTSource(fn, sig, {(names.index(k),): v for k, v in constexprs.items()}, attrs)
    print(f"compiling {case}", file=sys.stderr, flush=True)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps,
                                                                           "num_stages": num_stages})
    return out.metadata.shared


def staged_cases(settings, vocab: int) -> dict:
    """The Gluon statistics sweep of forward-only calls (staged.py) at sweep.StagedStats's launch shape, bf16 and
    float32 logits, with and without a mask. Newer Gluon renamed two calls the H200's triton 3.6 has: aliased."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    if not hasattr(gl, "thread_barrier"):
        gl.thread_barrier = gl.barrier
    if hasattr(async_copy, "async_load"):
        async_copy.async_copy_global_to_shared = async_copy.async_load
    staged = importlib.import_module("fused_compile_pkg.staged")
    sweep = importlib.import_module("fused_compile_pkg.sweep")
    fn, out = staged._staged_row_stats_kernel, {}
    # V 33000 in fp16: a multiple of VEC (8) but not of 16, so the JIT gives V and the row stride no divisibility
    for dtype, sig, v in ((torch.bfloat16, "*bf16", vocab), (torch.float32, "*fp32", vocab), (torch.float16, "*fp16", 33000)):
        launch = sweep.StagedStats(1, v, dtype, torch.device("meta"), settings, 1.0)
        for has_mask in (True, False):
            c = dict(launch.shape, THREAD_STATS=True, HAS_MASK=has_mask)
            ptrs = {"x_ptr": sig, "mask_ptr": "*u8" if has_mask else sig, "count_ptr": "*i32"}
            names = fn.arg_names
            types_ = {n: "constexpr" if n in c else ptrs.get(n, "*fp32" if n.endswith("_ptr") else
                                                               "fp32" if n == "scale2" else "i32") for n in names}
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                     if types_[n].startswith("*") or (n in ("vocab", "stride_x") and v % 16 == 0)}
            src = GluonASTSource(fn, types_, {(names.index(k),): v for k, v in c.items()}, attrs)
            case = f"staged-stats-{sig[1:]}-v{v}-{'mask' if has_mask else 'nomask'}"
            print(f"compiling {case}", file=sys.stderr, flush=True)
            out[case] = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                       options={"num_warps": launch.warps}).metadata.shared
    return out


def epilogue_cases(settings, vocab: int) -> dict:
    """epilogue.py's persistent TMA GEMM at the settings' tile (bf16 and fp16, with and without a bias) and its
    combine (the triple and the log-prob, with and without a mask)."""
    epi = importlib.import_module("fused_compile_pkg.epilogue")
    bm, bn, bk, stages, warps = settings.forward_epilogue_tile
    out = {}
    for dt in ("bf16", "fp16"):
        for bias in (True, False):
            c = dict(BM=bm, BN=bn, BK=bk, GROUP_M=16, PROGRAMS=132, HAS_BIAS=bias, UPCAST=False)
            ptrs = {"a_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "b_desc": f"tensordesc<{dt}[{bn}, {bk}]>",
                    "bias_ptr": f"*{dt}" if bias else "*fp32", "ids_ptr": "*i64"}
            case = f"epilogue-gemm-{dt}{'-bias' if bias else ''}"
            out[case] = compile_(case, epi._epilogue_gemm_kernel, c, ptrs, warps, stages)
    for logp_only in (False, True):
        for mask in (True, False):
            c = dict(BLOCK=triton.next_power_of_2(triton.cdiv(vocab, bn)), HAS_MASK=mask, LOGP_ONLY=logp_only)
            case = f"epilogue-combine-{'logp' if logp_only else 'triple'}-{'mask' if mask else 'nomask'}"
            out[case] = compile_(case, epi._epilogue_combine_kernel, c, {"mask_ptr": "*u8" if mask else "*i64"}, 4)
    return out


def main() -> dict:
    kernels, sem_mod = load()
    settings = sem_mod.FusedSettings()
    vocab = 128256
    block = settings.block
    # the split kernel at the size fused_bench compares (the default is one program per row, split 1)
    piece_split = triton.cdiv(settings.split_elems or 16384, block) * block
    out = {}
    for name, (has_old, has_ref, has_mask, params) in MEMBERS.items():
        s = sem_mod.semantics_of(2, 1024, has_old=has_old, has_ref=has_ref, has_mask=has_mask, parameters=params)
        mask_sig = "*u8" if has_mask else "*i64"
        for logits in ("*bf16", "*fp32"):
            ptrs = {"x_ptr": logits, "g_ptr": "*bf16", "ids_ptr": "*i64", "mask_ptr": mask_sig, "count_ptr": "*i32"}
            if not s.sequence:
                for split in (1, triton.cdiv(vocab, piece_split)):
                    piece = triton.cdiv(vocab, block) * block if split == 1 else piece_split
                    for write in (True, False):
                        # the plan's sweeps (plan.FusedPlan.grad_sweep / forward_sweep): forward-only pipelined
                        sweep = dict(BLOCK=block, STAGES=1, VECTOR=False, HINTS=True)
                        if not write and settings.forward_sweep == "pipelined":
                            sweep = dict(BLOCK=settings.forward_block, STAGES=settings.forward_stages, VECTOR=True,
                                         HINTS=False)
                        c = dict(CHUNK=piece, SPLIT=split, SPLIT_P2=triton.next_power_of_2(split), **sweep,
                                 **s.switches(), NEEDS_LOGP=s.needs_logp or write, WRITE_GRAD=write, GIVEN=False,
                                 TARGET_GIVEN=False)
                        case = f"rows-{name}-{logits[1:]}-split{split}-{'grad' if write else 'loss'}"
                        out[case] = compile_(case, kernels._rows_kernel, c, ptrs, settings.num_warps)
                # forward-only after the staged sweep (sweep.py): the loss kernel reads (max, ln S)
                c = dict(c, SPLIT=1, SPLIT_P2=1, CHUNK=triton.cdiv(vocab, block) * block, NEEDS_LOGP=s.needs_logp,
                         WRITE_GRAD=False, GIVEN=True)
                case = f"rows-{name}-{logits[1:]}-given"
                out[case] = compile_(case, kernels._rows_kernel, c, ptrs, settings.num_warps)
                if logits == "*bf16":  # after the epilogue GEMM (epilogue.py): the target logit given too
                    c = dict(c, NEEDS_LOGP=True, TARGET_GIVEN=True)
                    out[f"rows-{name}-epilogue"] = compile_(f"rows-{name}-epilogue", kernels._rows_kernel, c,
                                                            dict(ptrs, x_ptr="*fp32", g_ptr="*fp32"), settings.num_warps)
            for logp_only, given in ((False, False), (True, False)) + (((False, True),) if s.sequence else ()):
                c = dict(BLOCK=block, HAS_OLD=s.has_old and not logp_only, HAS_KL=s.has_kl and not logp_only,
                         HAS_MASK=s.has_mask, LOGP_ONLY=logp_only, GIVEN=given, TARGET_GIVEN=False)
                case = f"stats-{name}-{logits[1:]}-{'logp' if logp_only else 'ws'}{'-given' if given else ''}"
                out[case] = compile_(case, kernels._stats_kernel, c, ptrs, settings.num_warps)
            if s.sequence and logits == "*bf16":  # after the epilogue GEMM
                c = dict(c, LOGP_ONLY=False, GIVEN=True, TARGET_GIVEN=True)
                out[f"stats-{name}-epilogue"] = compile_(f"stats-{name}-epilogue", kernels._stats_kernel, c,
                                                         dict(ptrs, x_ptr="*fp32"), settings.num_warps)
            if s.sequence:
                c = dict(HAS_KL=s.has_kl, HAS_MASK=s.has_mask, HAS_DELTA=s.has_delta, PER_SEQ_W=s.norm != 0,
                         BLOCK_T=1024)
                out[f"sequence-{name}"] = compile_(f"sequence-{name}", kernels._sequence_kernel, c, ptrs, 4)
                c = dict(CHUNK=piece_split, BLOCK=block, SPLIT=triton.cdiv(vocab, piece_split))
                out[f"coef-{name}-{logits[1:]}"] = compile_(f"coef-{name}", kernels._coef_grad_kernel, c, ptrs,
                                                           settings.num_warps)
    for dtype in ("*bf16", "*fp32"):
        out[f"rescale-{dtype[1:]}"] = compile_("rescale", kernels._rescale_kernel, dict(BLOCK=4096),
                                               {"x_ptr": dtype}, 4)
    out.update(staged_cases(settings, vocab))
    out.update(epilogue_cases(settings, vocab))
    out["acc-gemm"] = compile_("acc-gemm", kernels._acc_gemm_kernel,
                               dict(BM=128, BN=256, BK=64, GROUP_M=8, UPCAST=False, s_am=1, s_bn=1, s_cn=1),
                               {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32"}, 8, 3)
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
