"""implementations/triton for every member it declares, under TRITON_INTERPRET=1, against the
float64 reference (grpo_conform.ops.grpo_logits.reference), through autograd as the validator calls it.

Also the device-side choice of where the gradient is written (plan.py, notes rounds 8-9): a run
of upstream scalars 1, 0.25, 0.25, 0.25, 1, 1, 1 makes the forward predict d loss right (gradient
in forward, times 1), wrong (recomputed from the statistics in backward), not at all (statistics,
gradient in backward), right (gradient in forward times 0.25), wrong, not at all, right; every one
must give d loss * the reference gradient. token-is defers everything to backward (its loss does
not read the logits): no mode, the flag never moves. One subprocess (the
variable must be set before triton is imported); small shapes (the interpreter is slow).

The Gluon (staged) kernels are compiled, not run, here: benchmarks/compile_staged.py, for every switch
set the launcher uses. To compile them offline against another triton (the H200 runs 3.6), install
that wheel into a folder of its own and put it first on the path:
    python3 -m pip install --no-deps --target /tmp/site36 triton==3.6.0
    PYTHONPATH=/tmp/site36 python3 benchmarks/compile_staged.py implementations/triton"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("triton", reason="the Triton implementation needs triton")

SCRIPT = r'''
import importlib, json, sys, types
import torch
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss

folder, spec_path = sys.argv[1], sys.argv[2]
pkg = types.ModuleType("grpo_impl_triton_m"); pkg.__path__ = [folder]; sys.modules[pkg.__name__] = pkg
impl = importlib.import_module(pkg.__name__ + ".impl")
manifest = open(folder + "/implementation.toml").read()
family = json.load(open(spec_path))
common = {p["name"]: p for p in family["common"]["parameters"]}
B, S, V = 3, 5, 300
# Values that make every term bite at this size (the spec's defaults are for seq 1024).
OVERRIDE = {"temperature": 0.8, "epsilon_high": 0.28, "max_completion_length": 7, "num_items_in_batch": 9,
            "num_processes": 2, "sampling_ratio_cap": 1.5, "delta": 1.1, "beta": 0.05,
            "gradient_accumulation_steps": 3, "steps_per_generation": 2}
SCALES = (1.0, 0.25, 0.25, 0.25, 1.0, 1.0, 1.0)


def inputs(dtype, student, seed=1):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, S + 1, V, generator=g) * 2)
    ids = torch.randint(0, V, (B, S), generator=g)
    ids[0, 0], ids[1, S - 1] = 0, V - 1
    if student:  # a Student-t row at its worst (p = 1/2 twice; logp ~ -5e5 for the other targets: the
        # kernels form logp - old and ref - logp in float64, else one fp32 rounding is 3% of the ratio)
        huge = 60000.0 if dtype == torch.float16 else 413696.0
        logits[1, 2, 7] = logits[1, 2, 200] = huge
    logits = logits.to(dtype)
    with torch.no_grad():
        lp = torch.log_softmax(logits[:, :S].double() / 0.8, -1).gather(-1, ids[..., None])[..., 0]
    x = {"logits": logits, "completion_ids": ids, "advantages": torch.tensor([-0.7, 1.2, 0.4]),
         "old_logprobs": (lp + 0.3 * torch.randn(B, S, generator=g, dtype=torch.float64)).float(),
         "ref_logprobs": (lp + 0.3 * torch.randn(B, S, generator=g, dtype=torch.float64)).float(),
         "sampling_ratio": 0.5 + 1.5 * torch.rand(B, S, generator=g)}
    mask = torch.ones(B, S, dtype=torch.int64)
    mask[0, 3:] = 0
    mask[2, :] = 0  # a fully masked sequence
    x["completion_mask"] = mask
    return x


def member_call(member):
    names = [i if isinstance(i, str) else i["name"] for i in member["inputs"]]
    values = {}
    for p in member["parameters"]:
        name = p if isinstance(p, str) else p["name"]
        value = (p.get("value") if isinstance(p, dict) else None)
        if value is None:
            value = common[name].get("value")
        values[name] = OVERRIDE.get(name, value) if name != "epsilon_high" or value == common[name]["value"] else value
    return names, values


results = {}
for member in family["members"]:
    name = member["name"]
    if f'"{name}"' not in manifest:
        continue
    names, values = member_call(member)
    dtypes = (torch.bfloat16, torch.float16, torch.float32) if name in ("token-is", "token-offpolicy-mask-kl") \
        else (torch.bfloat16,)
    for dtype in dtypes:
        x = {k: v for k, v in inputs(dtype, True).items() if k in names}
        if str(values.get("vllm_importance_sampling_mode", "")).startswith("sequence"):
            # TRL's sequence modes: sequence 0's kept ratios multiply to 0.8, sequence 1's to 2.5 (cap 1.5)
            q = x["sampling_ratio"].double()
            keep = x["completion_mask"] != 0
            for b, target in ((0, 0.8), (1, 2.5)):
                n = int(keep[b].sum())
                prod = float(torch.exp(torch.log(q[b][keep[b]]).sum()))
                q[b] = torch.where(keep[b], q[b] * (target / prod) ** (1.0 / n), q[b])
            x["sampling_ratio"] = q.float()
        p = GrpoParameters.from_mapping(values)
        ref_loss = reference_loss(x, p)
        ref_grad = reference_gradient_dense(x, p)
        call_x = dict(x)
        if "completion_mask" in x:  # masked rows' logits must not matter
            poisoned = x["logits"].clone()
            poisoned[2] = float("nan")
            call_x["logits"] = poisoned
        with torch.no_grad():
            forward = float(impl.grpo_loss(**call_x, **values))
        rows = []
        for c in SCALES:
            leaf = call_x["logits"].clone().requires_grad_(True)
            loss = impl.grpo_loss(**{**call_x, "logits": leaf}, **values)
            plan = loss.grad_fn.plan if hasattr(loss.grad_fn, "plan") else None
            ws = loss.grad_fn.ws
            (loss * c).backward()
            g = leaf.grad.double()
            scored = g[:, :S]
            expect = c * ref_grad[:, :S]
            coupled = values.get("importance_sampling_level") == "sequence" or values.get("loss_type") == "vespo"
            token_level = not coupled and ws is not None
            rows.append({"c": c, "loss": float(loss.detach()), "deferred": ws is None,
                         "mode": [float(ws[-2]), float(ws[-1])] if token_level else None,
                         "flag_after": plan.flag.tolist() if plan is not None else None,
                         "frob": float((scored - expect).norm() / expect.norm()),
                         "worst": float((scored - expect).abs().max() / expect.abs().max()),
                         "finite": bool(torch.isfinite(g).all()), "last_zero": bool((g[:, S] == 0).all()),
                         "masked_zero": bool((g[2] == 0).all()) if "completion_mask" in x else True,
                         "dtype": str(leaf.grad.dtype), "shape": list(leaf.grad.shape)})
        leaf = call_x["logits"].clone().requires_grad_(True)
        loss = impl.grpo_loss(**{**call_x, "logits": leaf}, **values)
        loss.backward(retain_graph=True)
        loss.backward()
        twice = leaf.grad.double()[:, :S]
        results[f"{name}/{str(dtype)[6:]}"] = {
            "ref_loss": ref_loss, "forward": forward, "calls": rows, "sequence": values.get(
                "importance_sampling_level") == "sequence" or values.get("loss_type") == "vespo",
            "twice_frob": float((twice - 2 * ref_grad[:, :S]).norm() / (2 * ref_grad[:, :S]).norm())}

# Rows split into several chunks (the GPU's shape) where no program waits, so the interpreter can run
# them: the statistics-only mode (flag 1) of the main kernel (last chunk to arrive combines), the
# multi-chunk statistics kernel, and a backward whose work items are parts of rows.
from dataclasses import replace
plan_mod = sys.modules[pkg.__name__ + ".plan"]
base_tuning = impl.cpu_tuning
impl.cpu_tuning = lambda vocab: replace(base_tuning(vocab), main_chunk=128, main_block=64, stats_programs=60,
                                        stats_block=32, grad_chunk=64, grad_programs_per_sm=0,
                                        interp_rows=False)  # the plain kernels (members.py), not interp.py's
impl._PLANS.clear()
# token-is is not among them: its backward always waits (deferred plan), which needs a GPU (CUDA tests).
for name in ("token-offpolicy-mask", "token-offpolicy-mask-kl", "dapo-mask", "sequence-offpolicy-mask"):
    member = next(m for m in family["members"] if m["name"] == name)
    names, values = member_call(member)
    x = {k: v for k, v in inputs(torch.bfloat16, True).items() if k in names}
    p = GrpoParameters.from_mapping(values)
    ref_loss, ref_grad = reference_loss(x, p), reference_gradient_dense(x, p)
    with torch.no_grad():
        forward = float(impl.grpo_loss(**x, **values))  # builds the plan
    (plan,) = list(impl._PLANS.values())
    plan.flag[0] = 1.0  # as if the last backward's d loss had not repeated: nobody waits in forward
    leaf = x["logits"].clone().requires_grad_(True)
    loss = impl.grpo_loss(**{**x, "logits": leaf}, **values)
    (loss * 0.5).backward()
    g = leaf.grad.double()[:, :S]
    results[f"multichunk/{name}"] = {
        "ref_loss": ref_loss, "forward": forward, "loss": float(loss.detach()),
        "chunks": [plan.main_n, plan.stats_n, plan.grad_n], "flag_after": plan.flag.tolist(),
        "frob": float((g - 0.5 * ref_grad[:, :S]).norm() / (0.5 * ref_grad[:, :S]).norm()),
        # counters are never reset (members.py): each launch adds the chunk count to every live token's
        "counters_whole": {k: bool((c.tensor % plan.chunks[k] == 0).all()) and bool((c.tensor > 0).any())
                           for k, c in plan._counters.items()}}
    impl._PLANS.clear()
print(json.dumps(results))
'''

TOLERANCE = {"bfloat16": (1e-2, 2 ** -7), "float16": (1e-2, 2 ** -9), "float32": (1e-5, 1e-5)}
DECLARED = {"token-is", "token-offpolicy-mask", "token-offpolicy-mask-kl", "bnpo-mask", "dr-grpo-mask", "dapo-mask",
            "sequence-offpolicy-mask", "token-offpolicy-mask-delta", "cispo-mask", "dapo-global-mask", "vllm-is-mask",
            "token-offpolicy-mask-kl-bc", "vllm-token-mask", "vllm-sequence-truncate", "vllm-sequence-mask",
            "dapo-global-accum-mask",
            "sapo-mask", "luspo-mask", "luspo-sequence-mask", "vespo-mask"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    script = tmp_path_factory.mktemp("triton_members") / "run.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(script), str(ROOT / "implementations" / "triton"),
                          str(ROOT / "specs" / "grpo.v1.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_declared_member_ran(results):
    assert {k.split("/")[0] for k in results} - {"multichunk"} == DECLARED
    assert {"token-is/float16", "token-is/float32", "token-offpolicy-mask-kl/float32"} <= set(results)


@pytest.mark.slow
@pytest.mark.parametrize("member", sorted(DECLARED))
def test_member_loss_and_gradient_match_the_reference(results, member):
    for key in [k for k in results if k.startswith(member + "/") and "multichunk" not in k]:
        r = results[key]
        frob_tol, worst_tol = TOLERANCE[key.split("/")[1]]
        ref = r["ref_loss"]
        assert abs(r["forward"] - ref) <= 2e-5 * max(1.0, abs(ref)), (key, "no_grad forward", r["forward"], ref)
        for c in r["calls"]:
            assert abs(c["loss"] - ref) <= 2e-5 * max(1.0, abs(ref)), (key, c)
            assert c["finite"] and c["last_zero"] and c["masked_zero"], (key, c)
            assert c["frob"] < frob_tol and c["worst"] < worst_tol, (key, c)
        assert r["twice_frob"] < frob_tol, (key, "second backward", r["twice_frob"])


@pytest.mark.slow
@pytest.mark.parametrize("member", sorted(DECLARED))
def test_gradient_mode_follows_the_last_upstream_scalar(results, member):
    """Token level (not deferred): the forward writes c_pred * gradient in mode 0, c_pred being the last
    d loss; a d loss that repeats the previous one switches mode 0 on, one that differs switches it off
    (statistics, gradient in backward). Whatever the prediction the gradients above are right. Sequence
    level and token-is (deferred) leave everything to backward: the flag never moves."""
    r = results[member + "/bfloat16"]
    modes = [c["mode"] for c in r["calls"]]
    flags = [c["flag_after"] for c in r["calls"]]
    if r["sequence"] or r["calls"][0]["deferred"]:  # no gradient in forward at all: the flag never moves
        assert flags == [[0.0, 1.0]] * 7, flags
        assert r["calls"][0]["deferred"] == (member == "token-is"), member
    else:
        # [mode, c_pred] each forward used; the flag after each backward: [next mode, last d loss]
        assert modes == [[0, 1], [0, 1], [1, 0.25], [0, 0.25], [0, 0.25], [1, 1], [0, 1]], modes
        assert flags == [[0, 1], [1, 0.25], [0, 0.25], [0, 0.25], [1, 1], [0, 1], [0, 1]], flags


@pytest.mark.slow  # ~50 s CPU on a clean clone (no Triton cache): every switch set compiled to PTX
def test_staged_kernels_compile_for_sm90():
    """The Gluon kernels cannot run here, but they must compile (frontend to PTX) for an H200 for every switch
    set the launcher uses (each member of the manifest, three launch shapes: benchmarks/compile_staged.py),
    every member kernel with the same shared-memory footprint at that shape.
    Against the H200's triton instead of the installed one (no GPU needed; 3.6 crashed on token-is's switch
    set while 3.9 compiled it, notes round 8): install that wheel into a folder of its own,
    `python3 -m pip install --no-deps --target /tmp/site36 triton==3.6.0`, and run
    `PYTHONPATH=/tmp/site36 python3 benchmarks/compile_staged.py implementations/triton`."""
    pytest.importorskip("triton.experimental.gluon")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_staged.py"),
                          str(ROOT / "implementations" / "triton")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    if run.returncode != 0 and "GluonASTSource" in run.stderr and "ImportError" in run.stderr:
        pytest.skip("this triton has no offline Gluon compile entry")
    assert run.returncode == 0, run.stderr[-3000:]
    shared = json.loads(run.stdout.strip().splitlines()[-1])
    tags = {case.split("@")[1] for case in shared}
    assert tags == {"bf16-128256", "fp32-128256", "bf16-5008"}, shared
    members = {case.split("@")[0][len("member-"):] for case in shared if case.startswith("member-")}
    assert {"token-is", "token-offpolicy-mask-kl", "cispo-mask", "vllm-is-mask", "dr-grpo-mask"} <= members, members
    for tag in tags:
        footprints = {shared[f"member-{name}@{tag}"] for name in members}
        assert len(footprints) == 1, (tag, shared)  # every switch set stages the same chunk
        for name in members:
            assert shared[f"stats-{name}@{tag}"] > 0, (name, tag, shared)
    assert shared["member-token-is@bf16-128256"] >= 20480, shared  # the 20 KB stage of launch.GPU_DEFAULT
    assert min(v for k, v in shared.items() if k.startswith("stats-") and "128256" in k) >= 32768, shared


def test_fast_launch_passes_the_jit_argument_list():
    """fastlaunch.Launch: the first launch goes through the JIT, later ones call the compiled launcher with
    every parameter in definition order (constexprs last) and the launch hooks off."""
    sys.path.insert(0, str(ROOT / "implementations"))
    import importlib
    import types

    pkg = types.ModuleType("grpo_impl_triton_fl")
    pkg.__path__ = [str(ROOT / "implementations" / "triton")]
    sys.modules[pkg.__name__] = pkg
    fastlaunch = importlib.import_module(pkg.__name__ + ".fastlaunch")
    seen = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def run(self, *a):
            seen.append(("direct", a))

    class Kernel:
        arg_names = ["out", "n", "x", "ADD", "BLOCK"]

        def __getitem__(self, grid):
            def jit(*args, **kw):
                seen.append(("jit", grid, args, kw))
                return Compiled()
            return jit

    fastlaunch._STATE.update(ok=True, why="")
    try:
        launch = fastlaunch.Launch(Kernel(), (7,), {"ADD": 3.0, "BLOCK": 128}, {"num_warps": 4}, fast=True)
        launch(1234, "out", 5, 0.5)
        launch(1234, "out", 5, 0.25)
        assert seen[0] == ("jit", (7,), ("out", 5, 0.5), {"ADD": 3.0, "BLOCK": 128, "num_warps": 4})
        assert seen[1] == ("direct", (7, 1, 1, 1234, "fn", "meta", None, None, None, "out", 5, 0.25, 3.0, 128))
        slow = fastlaunch.Launch(Kernel(), (7,), {"ADD": 3.0, "BLOCK": 128}, {"num_warps": 4}, fast=False)
        slow(0, "o", 1, 1.0)
        slow(0, "o", 1, 1.0)
        assert [s[0] for s in seen[2:]] == ["jit", "jit"]
    finally:
        fastlaunch._STATE.clear()
    import torch

    assert fastlaunch.enabled(torch.device("cpu")) is False and "not CUDA" in fastlaunch.status()
    fastlaunch._STATE.clear()


@pytest.mark.slow
def test_rows_split_into_chunks_without_waiting(results):
    """Statistics-only forward with rows in several chunks (last arriver combines), backward in parts of rows;
    every counter a whole multiple of its kernel's chunk count (members.py: the launches' arithmetic)."""
    keys = [k for k in results if k.startswith("multichunk/")]
    assert len(keys) == 4
    for k in keys:
        r = results[k]
        assert r["chunks"][0] > 1 and r["chunks"][1] > 1 and r["chunks"][2] > 1, r
        assert abs(r["loss"] - r["ref_loss"]) <= 2e-5 * max(1.0, abs(r["ref_loss"])), (k, r)
        assert abs(r["forward"] - r["ref_loss"]) <= 2e-5 * max(1.0, abs(r["ref_loss"])), (k, r)
        assert r["frob"] < 1e-2 and r["counters_whole"] and all(r["counters_whole"].values()), (k, r)


def test_fast_launch_reads_an_empty_hook_chain_as_no_hook():
    """Triton >= 3.5 keeps a HookChain in knobs.runtime even when nothing is registered; only a chain
    with a hook in it (a profiler) must keep the direct launcher off."""
    import importlib
    import types

    from triton import knobs

    pkg = types.ModuleType("grpo_impl_triton_hooks")
    pkg.__path__ = [str(ROOT / "implementations" / "triton")]
    sys.modules[pkg.__name__] = pkg
    fastlaunch = importlib.import_module(pkg.__name__ + ".fastlaunch")
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this triton has no hook chains")
    assert fastlaunch._hooks_off()

    def hook(*_):
        pass

    chain.add(hook)
    try:
        assert not fastlaunch._hooks_off()
    finally:
        chain.remove(hook)
    assert fastlaunch._hooks_off()
