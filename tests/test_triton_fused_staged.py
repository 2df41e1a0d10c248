"""implementations/triton-fused's staged forward sweep (staged.py, sweep.py): where it runs, its launch shape,
its vendored helpers, and (CUDA only) its loss against the pipelined sweep and the float64 reference.

The Gluon kernel does not run under the interpreter; on the CPU the plan keeps the pipelined sweep (the
interpreter suite in test_triton_fused.py runs that). The CUDA test runs on the H200 (benchmarks/h200_evidence.sh
round32s); test_triton_fused.py::test_every_kernel_compiles_for_sm90 compiles the kernel for sm_90 here.
"""

from __future__ import annotations

import ast
import importlib
import math
import sys
import types

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the Triton implementation needs triton")

FOLDER = ROOT / "implementations" / "triton-fused"
VENDORED = ("_block_offsets", "_copy_chunk", "_chunk_stats", "_combine2")


def _load(name: str):
    pkg = types.ModuleType("grpo_impl_triton_fused_staged")
    pkg.__path__ = [str(FOLDER)]
    sys.modules.setdefault(pkg.__name__, pkg)
    return importlib.import_module(f"{pkg.__name__}.{name}")


def _functions(path, names) -> dict:
    tree = ast.parse(path.read_text())
    return {n.name: ast.dump(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}


def test_vendored_gluon_helpers_equal_their_originals():
    """staged.py copies implementations/triton's chunk steps (a folder runs alone in the worker): a fix there
    must be copied here."""
    copies = _functions(FOLDER / "staged.py", VENDORED)
    originals = _functions(ROOT / "implementations" / "triton" / "staged_chunks.py", VENDORED)
    assert set(copies) == set(VENDORED)
    for name in VENDORED:
        assert copies[name] == originals[name], f"staged.py's {name} differs from implementations/triton's"


@pytest.mark.parametrize("device, vocab, dtype, settings, reason", [
    ("cpu", 128256, "bfloat16", {}, "not a CUDA device"),
    ("cuda", 50257, "bfloat16", {}, "16-byte boundaries"),
    ("cuda", 50258, "float32", {}, "16-byte boundaries"),
    ("cuda", 128256, "bfloat16", {"forward_sweep": "pipelined"}, "forward_sweep is 'pipelined'"),
    ("cuda", 128256, "bfloat16", {}, None),
    ("cuda", 50260, "float32", {}, None),
])
def test_where_the_staged_sweep_runs(monkeypatch, device, vocab, dtype, settings, reason):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    sweep, sem = _load("sweep"), _load("semantics")
    got = sweep.why_not(torch.device(device), vocab, getattr(torch, dtype), sem.FusedSettings(**settings))
    assert (got is None) if reason is None else (reason in got), got


def test_the_interpreter_keeps_the_pipelined_sweep(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sweep, sem = _load("sweep"), _load("semantics")
    assert "interpreter" in sweep.why_not(torch.device("cuda"), 128256, torch.bfloat16, sem.FusedSettings())


def test_a_cpu_plan_has_no_staged_sweep_and_says_why():
    plan, sem = _load("plan"), _load("semantics")
    s = sem.semantics_of(2, 8, has_old=True, has_ref=False, has_mask=True, parameters={})
    p = plan.FusedPlan(2, 8, 16, 128, torch.bfloat16, torch.device("cpu"), s, sem.FusedSettings())
    assert p.staged is None and "not a CUDA device" in p.staged_off
    assert p.forward_sweep == dict(BLOCK=128, STAGES=3, VECTOR=True, HINTS=False)  # the pipelined fallback


@pytest.mark.parametrize("vocab, dtype, chunk, n", [
    (128256, torch.bfloat16, 16384, 8),  # the seed vocabulary: 32 KB chunks, the last one 13568 elements
    (128256, torch.float32, 8192, 16),
    (4096, torch.bfloat16, 4096, 1),  # one chunk: no arrival, no combine
    (32000, torch.float16, 16384, 2),
])
def test_launch_shape_is_implementations_triton_s_statistics_shape(vocab, dtype, chunk, n):
    """32 KB a program in blocks of 2048 elements (bf16) over 4 warps: launch.GPU_DEFAULT's statistics pass."""
    sweep, sem = _load("sweep"), _load("semantics")
    st = sweep.StagedStats(3, vocab, dtype, torch.device("meta"), sem.FusedSettings(), 1.0)
    assert (st.shape["CHUNK"], st.shape["NUM_CHUNKS"]) == (chunk, n)
    assert st.shape["CHUNK"] % st.shape["BLOCK"] == 0 and st.shape["CHUNKS_P2"] >= n
    assert st.shape["VEC"] * torch.tensor([], dtype=dtype).element_size() == 16
    assert tuple(st.counts.shape) == (3,) and tuple(st.m_part.shape) == (3 * n,)


@pytest.mark.parametrize("bad, field", [(dict(forward_sweep="wide"), "forward_sweep"),
                                        (dict(forward_stage_warps=3), "forward_stage_warps"),
                                        (dict(forward_stage_block=3000), "forward_stage_block")])
def test_staged_settings_are_checked(bad, field):
    with pytest.raises(ValueError, match=field):
        _load("semantics").FusedSettings(**bad)


# --- CUDA: the staged sweep's loss against the pipelined sweep's and the float64 reference ---------------------

MEMBERS = {  # name: (inputs, parameters)
    "token-offpolicy-mask": (dict(mask=True, old=True), dict(loss_type="grpo")),
    "token-offpolicy-mask-kl": (dict(mask=True, old=True, ref=True), dict(loss_type="grpo", beta=0.1)),
    "dapo-mask": (dict(mask=True, old=True), dict(loss_type="dapo")),
    "token-is-unmasked-old": (dict(old=True), dict(loss_type="grpo")),
    "sequence-offpolicy-mask": (dict(mask=True, old=True), dict(loss_type="grpo", importance_sampling_level="sequence")),
}


def _inputs(b, t, h, v, dtype, seed, mask=False, old=False, ref=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = {"hidden": (torch.randn(b, t, h, generator=g, device="cuda") * 2).to(dtype),
         "weight": (torch.randn(v, h, generator=g, device="cuda") / math.sqrt(h)).to(dtype),
         "completion_ids": torch.randint(0, v, (b, t), generator=g, device="cuda"),
         "advantages": torch.randn(b, generator=g, device="cuda")}
    x["completion_ids"][0, 0], x["completion_ids"][-1, -1] = 0, v - 1  # the vocabulary's two ends
    if mask:  # right padding, and a sequence with no token at all
        n = torch.randint(0, t + 1, (b,), generator=g, device="cuda")
        n[0] = 0
        x["completion_mask"] = torch.arange(t, device="cuda")[None, :] < n[:, None]
    z = (x["hidden"].double() @ x["weight"].double().T)
    lp = torch.log_softmax(z, -1).gather(-1, x["completion_ids"][..., None])[..., 0]
    if old:
        x["old_logprobs"] = (lp + 0.3 * torch.randn(b, t, generator=g, device="cuda", dtype=torch.float64)).float()
    if ref:
        x["ref_logprobs"] = (lp + 0.5 * torch.randn(b, t, generator=g, device="cuda", dtype=torch.float64)).float()
    if mask:  # masked rows must not be read: NaN there
        off = ~x["completion_mask"]
        x["hidden"] = x["hidden"].masked_fill(off[..., None], float("nan"))
        x["old_logprobs"] = x["old_logprobs"].masked_fill(off, float("nan"))
    return x


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the staged sweep runs on CUDA only")
@pytest.mark.parametrize("member", sorted(MEMBERS))
@pytest.mark.parametrize("v, dtype, logits, rows", [
    (128256, torch.bfloat16, "weight", None),  # 8 chunks a row, one forward chunk
    (128256, torch.bfloat16, "weight", 48),  # forward chunks of 48 rows (GSPO: 2 sequences): counters reused
    (4096, torch.bfloat16, "weight", None),  # one chunk a row
    (33000, torch.float16, "weight", None),  # a partial last chunk
    (50260, torch.bfloat16, "float32", None),  # float32 logits (their own buffer)
])
def test_staged_forward_equals_the_pipelined_one_and_the_reference(member, v, dtype, logits, rows):
    from grpo_conform.ops.fused_linear.reference import reference_loss
    from grpo_conform.ops.grpo_terms import GrpoParameters

    impl, sem, sweep = _load("impl"), _load("semantics"), _load("sweep")
    kw, extra = MEMBERS[member]
    params = dict(epsilon_low=0.2, epsilon_high=0.28, temperature=0.8, **extra)
    x = _inputs(4, 24, 64, v, dtype, 7, **kw)
    staged = sem.FusedSettings(logits=logits, forward_rows=rows, forward_gemm="cublas")  # not the epilogue's GEMM
    pipelined = sem.FusedSettings(logits=logits, forward_rows=rows, forward_sweep="pipelined", forward_gemm="cublas")
    with torch.no_grad():
        got = [float(impl.grpo_fused_linear_loss(**x, settings=staged, **params)) for _ in range(3)]
        base = float(impl.grpo_fused_linear_loss(**x, settings=pipelined, **params))
    plans = [p for p in impl._PLANS.values() if p.settings == staged]
    assert plans and all(p.staged is not None for p in plans), [p.staged_off for p in plans]
    assert not sweep.DISABLED, sweep.DISABLED
    assert got[0] == got[1] == got[2], got  # the never-reset counters: every call combines the same way
    assert math.isfinite(got[0])
    assert abs(got[0] - base) <= 1e-5 * max(1.0, abs(base)), (got[0], base)
    clean = {k: (t.nan_to_num(0.0) if t.is_floating_point() else t) for k, t in x.items()}
    x64 = {k: (t.double() if t.is_floating_point() else t) for k, t in clean.items()}
    want = float(reference_loss(x64, GrpoParameters.from_mapping(params)))
    assert abs(got[0] - want) <= 2e-2 * max(1.0, abs(want)), (got[0], want)


# --- CUDA: the epilogue GEMM's forward (epilogue.py) against the pipelined sweep's and the float64 reference ------

EPILOGUE_MEMBERS = dict(MEMBERS, **{
    "token-is-bias-old": (dict(old=True, bias=True), dict(loss_type="grpo")),
    "token-offpolicy-mask-kl-ref-weight": (dict(mask=True, old=True, ref_weight=True), dict(loss_type="grpo", beta=0.1)),
})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the epilogue GEMM runs on CUDA (TMA) and the interpreter")
@pytest.mark.parametrize("member", sorted(EPILOGUE_MEMBERS))
@pytest.mark.parametrize("v, dtype, h", [
    (128256, torch.bfloat16, 256),  # the seed vocabulary: 501 tiles of 256, the last partial
    (33000, torch.float16, 64),  # one inner step
    (50257, torch.bfloat16, 72),  # an odd V (the staged sweep cannot run there) and a partial inner step
])
def test_epilogue_forward_equals_the_pipelined_one_and_the_reference(member, v, dtype, h):
    from grpo_conform.ops.fused_linear.reference import reference_loss
    from grpo_conform.ops.grpo_terms import GrpoParameters

    impl, sem = _load("impl"), _load("semantics")
    kw, extra = EPILOGUE_MEMBERS[member]
    kw = dict(kw)  # the table's dicts stay whole for the next parameters
    bias, ref_weight = kw.pop("bias", False), kw.pop("ref_weight", False)
    params = dict(epsilon_low=0.2, epsilon_high=0.28, temperature=0.8, **extra)
    x = _inputs(4, 24, h, v, dtype, 11, **kw)
    g = torch.Generator(device="cuda").manual_seed(12)
    if bias:
        x["bias"] = torch.randn(v, generator=g, device="cuda").to(dtype)
    if ref_weight:
        x["ref_weight"] = (x["weight"].float() + 0.05 * torch.randn(v, h, generator=g, device="cuda")).to(dtype)
        x["ref_hidden"] = (x["hidden"].float() + 0.3 * torch.randn(4, 24, h, generator=g, device="cuda")).to(dtype)
    epilogue = sem.FusedSettings()
    pipelined = sem.FusedSettings(forward_sweep="pipelined", forward_gemm="cublas")
    with torch.no_grad():
        got = [float(impl.grpo_fused_linear_loss(**x, settings=epilogue, **params)) for _ in range(2)]
        base = float(impl.grpo_fused_linear_loss(**x, settings=pipelined, **params))
    plans = [p for p in impl._PLANS.values() if p.settings == epilogue and p.vocab == v and p.hidden == h]
    assert plans and all(p.epilogue is not None for p in plans), [p.epilogue_off for p in plans]
    assert got[0] == got[1] and math.isfinite(got[0]), got  # deterministic: no atomics, a fixed tile walk
    # the sweeps read bf16-rounded logits, the epilogue its float32 accumulator: equal to the rounding
    assert abs(got[0] - base) <= 5e-3 * max(1.0, abs(base)), (got[0], base)
    clean = {k: (t.nan_to_num(0.0) if t.is_floating_point() else t) for k, t in x.items()}
    x64 = {k: (t.double() if t.is_floating_point() else t) for k, t in clean.items()}
    want = float(reference_loss(x64, GrpoParameters.from_mapping(params)))
    assert abs(got[0] - want) <= abs(base - want) + 1e-4 * max(1.0, abs(want)), (got[0], base, want)


@pytest.mark.parametrize("device, rows, hidden, dtype, settings, reason", [
    ("cuda", 4096, 4096, "bfloat16", {"forward_gemm": "cublas"}, "forward_gemm is 'cublas'"),
    ("cuda", 8192, 4096, "bfloat16", {}, "over forward_epilogue_rows"),
    ("cuda", 2048, 4096, "float32", {}, "tf32"),
    ("cuda", 2048, 4095, "float16", {}, "16-byte boundaries"),
    ("cpu", 2048, 4096, "bfloat16", {}, "not a CUDA device"),
])
def test_where_the_epilogue_forward_runs(monkeypatch, device, rows, hidden, dtype, settings, reason):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    epi, sem = _load("epilogue"), _load("semantics")
    got = epi.why_not(torch.device(device), rows, hidden, getattr(torch, dtype), sem.FusedSettings(**settings))
    assert reason in got, got


def test_the_interpreter_runs_the_epilogue_forward(monkeypatch):
    """The CPU tiers check the epilogue's forward (tl.dot upcast: test_triton_fused.py)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    epi, sem = _load("epilogue"), _load("semantics")
    assert epi.why_not(torch.device("cpu"), 64, 32, torch.bfloat16, sem.FusedSettings()) is None
    with pytest.raises(ValueError, match="forward_gemm"):
        sem.FusedSettings(forward_gemm="triton")
    with pytest.raises(ValueError, match="forward_epilogue_tile"):
        sem.FusedSettings(forward_epilogue_tile=(128, 200, 64, 3, 8))


def test_operands_off_16_bytes_take_the_cublas_path():
    """TMA needs 16-byte aligned bases and row strides: an offset view (the input-layouts probe's) is refused by
    `usable`, and the plan then runs cuBLAS and the sweep for that call."""
    epi, sem = _load("epilogue"), _load("semantics")
    st = epi.EpilogueStats(8, 40, 32, torch.device("cpu"), sem.FusedSettings(), 1.0, 0.0)
    base = torch.zeros(8 * 32 + 1, dtype=torch.bfloat16)
    w = torch.zeros(40, 32, dtype=torch.bfloat16)
    assert st.usable(base[: 8 * 32].view(8, 32), w)
    assert not st.usable(base[1:].view(8, 32), w)  # 2 bytes off
    assert st.usable(torch.zeros(8, 64, dtype=torch.bfloat16)[:, :32], w)  # a row stride of 128 bytes: fine
    assert not st.usable(torch.zeros(8, 33, dtype=torch.bfloat16)[:, :32], w)  # a row stride of 66 bytes
