"""implementations/triton/sequences.py compiled for a GPU on this CPU machine, with batch, seq and tokens
equal to 1. On a GPU the JIT passes an integer argument equal to 1 as a constexpr (a Python int), so a
kernel that calls `.to()` on such an argument compiles at every shape but batch 1, seq 1. The interpreter
never specializes, so only a compile sees it (the thirty-sixth session's H100 call found one in the default
check's `token-is batch1-seq1` workload). Compiled with the wheel's own LLVM and ptxas, for sm_90; no GPU.

A kernel whose scalar breaks only as a constexpr fails here; one that compiles with 1 passes."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from conftest import ROOT

triton = pytest.importorskip("triton", reason="the Triton implementation needs triton")

OFF = dict(HAS_OLD=True, HAS_KL=False, HAS_MASK=True, HAS_RHO=False, HAS_DELTA=False, HAS_CAP=False, CISPO=False,
           KL_BC=False, RHO_MASK=False, SEQ_RHO=False, SAPO=False, NEEDS_LOGP=True, NORM=1, SEQUENCE=False,
           VESPO=False, WRITE_COEF=True, BLOCK_T=128, BLOCK_B=8)
TERMS = {"gspo": dict(SEQUENCE=True), "vespo": dict(VESPO=True, HAS_RHO=True, HAS_CAP=True, NORM=0),
         "dapo-kl": dict(NORM=2, HAS_KL=True), "vllm-sequence-mask": dict(HAS_RHO=True, HAS_CAP=True, RHO_MASK=True,
                                                                          SEQ_RHO=True)}
NORM = dict(GLOBAL=False, WRITE_W=True, SEQ_RHO=True, HAS_MASK=True, BLOCK_T=128, BLOCK_B=8)
ONES = ("batch", "seq", "tokens")  # the shape arguments a batch 1, seq 1 call passes as 1


def _sequences():
    pkg = types.ModuleType("grpo_impl_triton_s")
    pkg.__path__ = [str(ROOT / "implementations" / "triton")]
    sys.modules[pkg.__name__] = pkg
    return importlib.import_module(pkg.__name__ + ".sequences")


def _compile(fn, flags: dict) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    signature, constants = {}, {}
    for i, name in enumerate(names):
        if name in flags or name in ONES:
            signature[name] = "constexpr"
            constants[(i,)] = flags.get(name, 1)
        else:
            signature[name] = "*fp32" if name.endswith("_ptr") else "fp32"
    triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32))


@pytest.fixture(scope="module")
def sequences():
    try:
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as exc:  # an older or newer Triton without this entry: say so, do not pass silently
        pytest.skip(f"this Triton has no triton.compiler.ASTSource: {exc}")
    return _sequences()


@pytest.mark.parametrize("case", sorted(TERMS))
def test_the_terms_kernel_compiles_at_batch_1_seq_1(sequences, case):
    _compile(sequences._terms_kernel, dict(OFF, **TERMS[case]))


def test_the_norm_kernel_compiles_at_batch_1_seq_1(sequences):
    _compile(sequences._norm_kernel, NORM)
