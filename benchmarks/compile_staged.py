"""Compile the staged (Gluon) kernels of implementations/triton for sm_90 offline: no GPU needed.

    python3 benchmarks/compile_staged.py implementations/triton            # the installed triton
    PYTHONPATH=/tmp/site36 python3 benchmarks/compile_staged.py implementations/triton

The second form compiles against another triton without installing it over the local one: put
that triton's wheel in a folder of its own (`python3 -m pip install --no-deps --target /tmp/site36
triton==3.6.0`, the H200's version; the wheel must match this Python) and name the folder in
PYTHONPATH, which comes before site-packages (torch and grpo_conform still come from there).

Cases are what the launchers really compile: for every member the manifest declares, its default parameters through plan.semantics_of and
staged_members.member_constexprs / stats_constexprs (the switch sets the launches use); all at the
launch shapes of launch.GPU_DEFAULT (launch._staged_shape) for a 128256 vocabulary in bf16 (13
chunks per row), in fp32 (other VEC and REPS) and a 5008 one (one chunk: the `NUM_CHUNKS > 1` code
is not emitted). Prints one JSON line {case: shared bytes}; each
case is named on stderr before it compiles, so on a failure the last such line names the case, then
the compiler's message (MLIR reproducer, LLVM assertion). For a backtrace of an assertion:
`gdb -batch -ex run -ex bt --args "$(python3 -c 'import sys; print(sys.executable)')" benchmarks/...`.
tests/test_triton_members.py::test_staged_kernels_compile_for_sm90 runs it and checks the footprints.
"""

import importlib
import json
import sys
import types
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import async_copy

sys.path.append(str(Path(__file__).resolve().parent.parent))  # grpo_conform from this checkout if not installed

# The device runs triton 3.6; newer Gluon renamed two calls: alias the old names to the new ones.
if not hasattr(gl, "thread_barrier"):
    gl.thread_barrier = gl.barrier
if hasattr(async_copy, "async_load"):
    async_copy.async_copy_global_to_shared = async_copy.async_load

FLOATS = {"scale2", "inv_temp", "inv_lo", "eps_low", "eps_high", "inv_bst", "delta", "beta", "cap", "w_const"}
INPUTS = {"old_logprobs": "has_old", "ref_logprobs": "has_ref", "completion_mask": "has_mask",
          "sampling_ratio": "has_rho"}
SHAPES = {"bf16-128256": (torch.bfloat16, 128256), "fp32-128256": (torch.float32, 128256),
          "bf16-5008": (torch.bfloat16, 5008)}
TORCH_TO_SIG = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


def load(folder: str):
    pkg = types.ModuleType("gt_compile")
    pkg.__path__ = [folder]
    sys.modules[pkg.__name__] = pkg
    return [importlib.import_module(f"{pkg.__name__}.{m}") for m in ("staged", "staged_members", "plan", "launch")]


def compile_(case, fn, constexprs, num_warps, logits_sig, mask_sig):
    names = fn.arg_names
    ptrs = {"logits_ptr": logits_sig, "grad_ptr": logits_sig, "ids_ptr": "*i64", "count_ptr": "*i32",
            "mask_ptr": mask_sig, "flag_ptr": "*fp32"}
    sig = {n: "constexpr" if n in constexprs else ptrs.get(n, "*fp32" if n.endswith("_ptr") else
                                                          "fp32" if n in FLOATS else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or n in ("vocab", "stride_b", "stride_t")}
    src = GluonASTSource(fn, sig, {(names.index(k),): v for k, v in constexprs.items()}, attrs)
    print(f"compiling {case}: {fn.__name__} {constexprs}", file=sys.stderr, flush=True)  # names a crash
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).metadata.shared


def member_semantics(folder: str, plan):
    """(member names, plan.Semantics) per member of the manifest, at the spec's default parameters."""
    from grpo_conform import implementations, spec

    manifest = implementations.load_implementation(Path(folder)).manifest
    for s in spec.specs_for_manifest(manifest):
        present = {flag: name in [i.name for i in s.inputs] for name, flag in INPUTS.items()}
        values = dict(s.parameter_values)
        sem = plan.semantics_of(
            2, 5, **present, epsilon_low=values["epsilon_low"], epsilon_high=values["epsilon_high"],
            temperature=values["temperature"], loss_type=values.get("loss_type", "grpo"),
            importance_sampling_level=values.get("importance_sampling_level", "token"), beta=values.get("beta", 0.0),
            max_completion_length=values.get("max_completion_length"), delta=values.get("delta"),
            sampling_ratio_cap=values.get("sampling_ratio_cap"), num_items_in_batch=values.get("num_items_in_batch"),
            num_processes=values.get("num_processes", 1),
            use_bias_correction_kl=values.get("use_bias_correction_kl", False),
            vllm_importance_sampling_mode=values.get("vllm_importance_sampling_mode", "token_truncate"),
            gradient_accumulation_steps=values.get("gradient_accumulation_steps"),
            steps_per_generation=values.get("steps_per_generation"))
        yield s.member or s.id, sem


def main(folder: str) -> dict:
    staged, staged_members, plan, launch = load(folder)
    g = launch.GPU_DEFAULT
    members = list(member_semantics(folder, plan))
    out = {}
    for tag, (dtype, vocab) in SHAPES.items():
        logits = torch.empty((1, 2, vocab), dtype=dtype, device="meta")
        p = launch.Problem.of(logits, 0.2, 0.2, 1.0)
        main_shape = launch._staged_shape(logits, p, g.stage_bytes, g.block, g.num_warps)
        stats_shape = launch._staged_shape(logits, p, g.forward_stage_bytes, g.forward_block, g.forward_stage_warps)
        sig = TORCH_TO_SIG[dtype]
        base = dict(THREAD_STATS=g.thread_stats)
        done = {}
        for name, sem in members:  # one compile per distinct switch set; every member named in the result
            mask_sig = "*u8" if sem.has_mask else "*i64"  # without a mask, the ids stand in (impl.py)
            for kind, fn, shape, warps, switches in (
                    ("member", staged._staged_member_kernel, main_shape, g.num_warps,
                     staged_members.member_constexprs(sem)),
                    ("stats", staged._staged_stats_kernel, stats_shape, g.forward_stage_warps,
                     staged_members.stats_constexprs(sem))):
                key, case = (kind, tuple(sorted(switches.items()))), f"{kind}-{name}@{tag}"
                if key not in done:
                    done[key] = compile_(case, fn, dict(shape, **base, **switches), warps, sig, mask_sig)
                out[case] = done[key]
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
