"""Rows that do not start on a 16-byte boundary (implementations/triton/staged_rows.py, the staged kernels'
HEAD path), without a GPU: the planner's choice, the head/body/tail split covering every element once, and
the Gluon kernels compiled offline for sm_90 with 16-byte copies and stores. Gluon does not run under
TRITON_INTERPRET=1: the numbers (HEAD against the reference and against the plain kernels) are checked on
the GPU by tests/test_triton_cuda.py, and under the interpreter here only for the plain kernels at the same
vocabularies (the side the GPU test compares against)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from collections import Counter

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _load(name):
    pkg_name = "grpo_impl_triton_unaligned_test"
    if pkg_name not in sys.modules:
        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = [str(ROOT / "implementations" / "triton")]
        sys.modules[pkg_name] = pkg
    return importlib.import_module(f"{pkg_name}.{name}")


launch = _load("launch")


def _layout(vocab, size=2, seq_next=6, stride_b=None, stride_t=None, ptr=1 << 20):
    stride_t = vocab if stride_t is None else stride_t
    stride_b = seq_next * stride_t if stride_b is None else stride_b
    return launch.row_layout(ptr, size, vocab, seq_next, stride_b, stride_t)


def test_gpt2_vocabulary_takes_the_staged_head_path():
    """V 50257 (the sweep's 2.8x row) ran the plain kernels: the old test (staged_ok) wants V % 16 == 0."""
    assert _layout(50257) == "head"
    assert _layout(50257, size=4) == "head"
    for vocab in (37, 51, 131, 4099, 40001, 50264):  # 50264: 16-byte rows, but V % 16 != 0 (the old test)
        assert _layout(vocab) == "head", vocab


def test_aligned_shapes_keep_the_aligned_kernels():
    """Exactly staged_ok's test: every record so far ran these kernels, HEAD=False."""
    for vocab in (32000, 128256, 151936, 262144, 5008, 1536):
        assert _layout(vocab) == "aligned"
        assert _layout(vocab, size=4) == "aligned"
    assert _layout(128256, stride_t=128256 + 16) == "aligned"  # a padded row pitch that keeps 16-element starts


def test_shapes_neither_path_serves_stay_plain():
    assert _layout(50257, ptr=(1 << 20) + 2) is None  # the head is counted from a 16-byte aligned base
    assert _layout(50257, stride_t=50257 + 3) is None  # logits' and gradient's heads would differ
    assert _layout(50257, stride_b=6 * 50257 + 1) is None
    assert _layout(15) is None and _layout(7, size=4) is None  # a row no longer than its head
    assert _layout(50257, stride_t=50257 + 8) == "head"  # the same head modulo VEC: still one split


def _split(offset, vocab, vec):
    """The kernel's own arithmetic (staged_rows._row_split on Python integers: V >= 16, nothing negative)."""
    return _load("staged_rows")._row_split.fn(offset, vocab, vec)


def _owners(offset, vocab, vec, shape):
    """Each element's count of owners as staged.py's HEAD path assigns them: body elements by the chunks'
    blocks (masked at `body`), head and tail by chunk 0's extras lanes (staged_rows._extra_offsets). Counted
    over ranges (int64 [max(vocab, h + body) + 2 VEC], past the row to hold an element beyond it) instead of
    an element -> owners dict filled one element at a time: 50257 elements x 21 offsets x 2 shapes was ~4.5 s
    of Python for the same counts."""
    h, body = _split(offset, vocab, vec)
    owners = torch.zeros(max(vocab, h + body) + 2 * vec, dtype=torch.int64)
    chunk, block, n = shape["CHUNK"], shape["BLOCK"], shape["NUM_CHUNKS"]
    for k in range(n):
        for i in range(chunk // block):
            first = k * chunk + i * block  # each thread copies VEC elements from first + a multiple of VEC
            assert first % vec == 0 and (offset + h + first) % vec == 0
            if first < body:
                owners[h + first : h + min(first + block, body)] += 1
    for j in range(2 * vec):
        idx = j if j < vec else h + body + j - vec
        if (j < h) if j < vec else (idx < vocab):
            owners[idx] += 1
    return h, body, owners


def _target_owner(target, h, body, chunk, n):
    """staged.py's `mine` for the one-hot fix, per program."""
    rel = target - h
    outside = rel < 0 or rel >= body
    return [k for k in range(n) if (not outside and k * chunk <= rel < (k + 1) * chunk) or (outside and k == 0)]


@pytest.mark.parametrize("dtype,vocab", [(torch.bfloat16, v) for v in (37, 51, 131, 5003, 50257)]
                         + [(torch.float32, v) for v in (37, 51, 131, 5003)], ids=str)  # fp32 at 50257: 4 s, no new residue
def test_head_body_tail_cover_every_element_once(vocab, dtype):
    """For every row start modulo VEC (rows r * V of a contiguous tensor, and odd offsets), at the launch
    shapes of both staged kernels: each element of the row is read and written by exactly one program, the
    body's 16-byte pieces start on 16-byte boundaries, head and tail are shorter than VEC, and exactly
    one program applies the target's one-hot term."""
    vec = 16 // torch.tensor([], dtype=dtype).element_size()
    logits = torch.empty((2, 5, vocab), dtype=dtype, device="meta")
    p = launch.Problem.of(logits, 0.2, 0.2, 1.0)
    g = launch.GPU_DEFAULT
    shapes = [launch._staged_shape(logits, p, g.stage_bytes, g.block, g.num_warps),
              launch._staged_shape(logits, p, g.forward_stage_bytes, g.forward_block, g.forward_stage_warps)]
    offsets = [r * vocab for r in range(2 * vec)] + [1, 3, 5, 7, 1000003]
    assert {o % vec for o in offsets} == set(range(vec))
    for shape in shapes:
        for offset in offsets:
            h, body, owners = _owners(offset, vocab, vec, shape)
            assert (offset + h) % vec == 0 and body % vec == 0 and h < vec and vocab - h - body < vec
            # every element of the row owned exactly once, none past it
            assert bool(owners[:vocab].eq(1).all()) and not bool(owners[vocab:].any()), (offset, Counter(owners.tolist()))
            for target in {0, h - 1, h, h + body - 1, h + body, vocab - 1, vocab // 2} - {-1}:
                if 0 <= target < vocab:
                    assert len(_target_owner(target, h, body, shape["CHUNK"], shape["NUM_CHUNKS"])) == 1


COMPILE = r'''
import json, re, sys
sys.path.insert(0, sys.argv[2])
import compile_staged as cs  # its 3.6 <-> 3.9 aliases, the folder loaded as a package
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
staged, staged_members, plan, launch = cs.load(sys.argv[1])
sem = plan.semantics_of(2, 5, has_old=True, has_ref=False, has_mask=True, has_rho=False, epsilon_low=0.2,
                        epsilon_high=0.2, temperature=1.0, loss_type="grpo", importance_sampling_level="token",
                        beta=0.0, max_completion_length=None, delta=None, sampling_ratio_cap=None,
                        num_items_in_batch=None, num_processes=1)
g, out = launch.GPU_DEFAULT, {}
for tag, dtype, vocab in (("bf16", torch.bfloat16, 50257), ("fp32", torch.float32, 5003)):
    logits = torch.empty((1, 2, vocab), dtype=dtype, device="meta")
    p = launch.Problem.of(logits, 0.2, 0.2, 1.0)
    for kind, fn, stage, block, warps, sw in (
            ("member", staged._staged_member_kernel, g.stage_bytes, g.block, g.num_warps,
             staged_members.member_constexprs(sem)),
            ("stats", staged._staged_stats_kernel, g.forward_stage_bytes, g.forward_block, g.forward_stage_warps,
             staged_members.stats_constexprs(sem))):
        cx = dict(launch._staged_shape(logits, p, stage, block, warps), THREAD_STATS=True, **dict(sw, HEAD=True))
        names = fn.arg_names
        ptrs = {"logits_ptr": "*" + tag, "grad_ptr": "*" + tag, "ids_ptr": "*i64", "count_ptr": "*i32",
                "mask_ptr": "*u8", "flag_ptr": "*fp32"}
        sig = {n: "constexpr" if n in cx else ptrs.get(n, "*fp32" if n.endswith("_ptr") else
                                                      "fp32" if n in cs.FLOATS else "i32") for n in names}
        # the JIT's specialisation at V 50257: every pointer 16-byte aligned, vocab and strides not
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
        src = GluonASTSource(fn, sig, {(names.index(k),): v for k, v in cx.items()}, attrs)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
        copies = re.findall(r"cp\.async\.c[ag]\.shared\.global\s+\[[^\]]+\],\s*\[[^\]]+\],\s*(\w+)", ptx)
        out[f"{kind}-{tag}"] = {"copies": copies, "blocks": cx["CHUNK"] // cx["BLOCK"],
                                "reps": cx["BLOCK"] // (32 * warps * cx["VEC"]),
                                "v4_stores": len(re.findall(r"st\.global\S*\.v4\.b32", ptx))}
# the backward's plain kernel (grad.py), HEAD on: its body's loads and stores 16 bytes wide
from triton.compiler import ASTSource
grad = __import__("gt_compile.grad", fromlist=["_grad_kernel"])
fn, names = grad._grad_kernel, grad._grad_kernel.arg_names
cx = dict(CHUNK=2048, NUM_CHUNKS=25, FORCE_STATS=True, UPDATE_FLAG=False, HINTS=True, HEAD=True, VEC=8)
ptrs = {"logits_ptr": "*bf16", "grad_ptr": "*bf16", "ids_ptr": "*i64"}
sig = {n: "constexpr" if n in cx else ptrs.get(n, "*fp32" if n.endswith("_ptr") else "fp32" if n == "inv_temp" else "i32")
       for n in names}
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
ptx = triton.compile(ASTSource(fn, sig, {(names.index(k),): v for k, v in cx.items()}, attrs),
                     target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
out["grad-bf16"] = {"ld_v4": len(re.findall(r"ld\.global\S*\.v4", ptx)),
                    "st_v4": len(re.findall(r"st\.global\S*\.v4", ptx)),
                    "ld_b16": len(re.findall(r"ld\.global(?!\S*\.v\d)\S*\.b16", ptx))}
print(json.dumps(out))
'''


@pytest.mark.slow  # ~30 s on 2 cores: four Gluon compiles and one Triton compile for sm_90, no GPU
def test_head_kernels_compile_to_16_byte_copies(tmp_path):
    """HEAD=True kernels, specialised as the JIT specialises them at V 50257 (vocabulary and strides not
    multiples of 16), compile for an H200 and keep cp.async at 16 bytes per copy, REPS per thread and block
    in each of the chunk's two copy loops (the masked last chunk and the others), and the gradient's
    16-byte stores: the alignment hints reached the compiler. Without them (an unaligned row pointer) the
    copies cannot be 16 bytes wide."""
    script = tmp_path / "compile_head.py"
    script.write_text(COMPILE)
    run = subprocess.run([sys.executable, str(script), str(ROOT / "implementations" / "triton"),
                          str(ROOT / "benchmarks")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # the backward kernel: 16 elements per thread and item (2048 / 128 threads) in two 16-byte loads and
    # stores (the old kernel at V 50257: 16 two-byte loads, triton 3.6); head and tail one element per thread
    grad = out.pop("grad-bf16")
    assert grad["ld_v4"] >= 2 and grad["st_v4"] >= 2 and grad["ld_b16"] <= 2, grad
    for case, rec in out.items():
        sizes = {int(c, 0) for c in rec["copies"]}
        assert sizes == {16}, (case, sizes)
        pieces = 2 * rec["blocks"] * rec["reps"]  # per thread: two copy loops, REPS pieces per block
        assert len(rec["copies"]) == pieces, (case, len(rec["copies"]), pieces)
        if case.startswith("member"):
            assert rec["v4_stores"] >= pieces, case


def test_the_two_row_split_twins_agree():
    """staged_rows._row_split (Gluon) and grad._row_split (Triton) are one formula in two dialects."""
    gluon_split, triton_split = _load("staged_rows")._row_split.fn, _load("grad")._row_split.fn
    for vec in (4, 8):
        for vocab in (16, 37, 131, 50257):
            for offset in range(0, 3 * vec * vocab, vocab):
                assert gluon_split(offset, vocab, vec) == triton_split(offset, vocab, vec)


INTERP = r'''
import importlib, json, sys, types
from dataclasses import replace
import torch
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss

pkg = types.ModuleType("grpo_impl_triton_head"); pkg.__path__ = [sys.argv[1]]; sys.modules[pkg.__name__] = pkg
impl = importlib.import_module(pkg.__name__ + ".impl")
base = impl.cpu_tuning
MEMBERS = {"token-offpolicy-mask": dict(loss_type="grpo"),
           "sequence-offpolicy-mask": dict(loss_type="grpo", importance_sampling_level="sequence")}
B, S = 2, 4
out = {}
# one dtype a vocabulary: 10 rows of V 37, 51 or 131 start at every residue modulo VEC of each dtype, so the
# diagonal reaches every head length of every dtype (the full 3 x 3 grid took 29 s of CI's suite for no case more)
for vocab, dtype in ((37, torch.bfloat16), (51, torch.float16), (131, torch.float32)):
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(B, S + 1, vocab, generator=g) * 2).to(dtype)
    ids = torch.randint(0, vocab, (B, S), generator=g)
    ids[0, 0], ids[0, 1], ids[1, 0] = 0, vocab - 1, 3  # head, tail and body targets in every row split
    with torch.no_grad():
        lp = torch.log_softmax(logits[:, :S].double() / 0.8, -1).gather(-1, ids[..., None])[..., 0]
    mask = torch.ones(B, S, dtype=torch.int64)
    mask[1, 3:] = 0
    x = {"logits": logits, "completion_ids": ids, "advantages": torch.tensor([-0.7, 1.2]),
         "old_logprobs": (lp + 0.3 * torch.randn(B, S, generator=g, dtype=torch.float64)).float(),
         "completion_mask": mask}
    for member, cfg in MEMBERS.items():
        params = dict(epsilon_low=0.2, epsilon_high=0.28, temperature=0.8, **cfg)
        p = GrpoParameters.from_mapping({"importance_sampling_level": "token", **params})
        ref_grad = reference_gradient_dense(x, p)[:, :S]
        grads, heads = {}, {}
        for head in (True, False):
            # the plain kernels (not interp.py's twins), rows in several backward work items of 16
            impl.cpu_tuning = lambda v, head=head: replace(base(v), interp_rows=False, grad_chunk=16,
                                                           grad_programs_per_sm=0, head=head)
            impl._PLANS.clear()
            calls = []
            for c in (1.0, 0.25):  # the token member's backward recomputes from the statistics at 0.25
                leaf = logits.clone().requires_grad_(True)
                loss = impl.grpo_loss(**{**x, "logits": leaf}, **params)
                (loss * c).backward()
                calls.append(leaf.grad.clone())
            (plan,) = impl._PLANS.values()
            heads[head] = plan.grad_head
            grads[head] = calls
        g1 = grads[True][1].double()
        out[f"{member}/{vocab}/{str(dtype)[6:]}"] = {
            "heads": [heads[True], heads[False]],
            "equal": all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                         for a, b in zip(grads[True], grads[False])),
            "frob": float((g1[:, :S] - 0.25 * ref_grad).norm() / (0.25 * ref_grad).norm()),
            "last_zero": bool((g1[:, S] == 0).all()), "masked_zero": bool((g1[1, 3] == 0).all())}
impl.cpu_tuning = base
print(json.dumps(out))
'''


@pytest.mark.slow  # ~10 s of interpreter: 6 cases, two launches each
def test_head_split_of_the_backward_kernel_under_the_interpreter(tmp_path):
    """grad._grad_kernel with HEAD (what the GPU runs at V 50257 for GSPO and mispredicted token calls) under
    TRITON_INTERPRET=1 at V 37 in bf16, 51 in fp16, 131 in fp32: the plan takes it (grad_head), the gradient
    is bit for bit the one-element path's (Tuning.head False: the launch before the split) and matches the
    float64 reference, masked and padding rows exactly zero."""
    script = tmp_path / "head_interp.py"
    script.write_text(INTERP)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(script), str(ROOT / "implementations" / "triton")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(out) == 6
    for case, rec in out.items():
        assert rec["heads"] == [True, False], case
        assert rec["equal"], case
        tol = 1e-5 if case.endswith("float32") else 1e-2
        assert rec["frob"] < tol, (case, rec["frob"])
        assert rec["last_zero"] and rec["masked_zero"], case
