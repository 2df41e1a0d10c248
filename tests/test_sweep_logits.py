"""benchmarks/sweep_logits.py (issue 36) without a GPU: the shape and job enumeration, its budget, the
floors, the tables and verdicts on fake timings, the proposed configs TABLE (round trip through
implementations/triton/configs.py), the JSON writer; then, under TRITON_INTERPRET=1 with a stub timer,
the sweep's own shape and --configs jobs end to end on a tiny shape; and the launch candidates that run on
the plain kernels give the shipped launch's loss and gradient bit for bit."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import types

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import sweep_plan as sp  # noqa: E402


def _configs():
    pytest.importorskip("triton")
    name = "grpo_impl_triton_sweeptest"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(ROOT / "implementations" / "triton")]
        sys.modules[name] = pkg
    return importlib.import_module(name + ".configs"), importlib.import_module(name + ".launch")


def test_shapes_cover_the_issue_grid_and_nothing_else():
    full = sp.shapes()
    assert len(full) == len(set(full)) == 2 * (5 * 4 * 2 + 5 * 2)  # dtypes x (V x batch x {512, 1024} + seq 8192)
    assert {s.vocab for s in full} == {32000, 50257, 128256, 151936, 262144}
    assert {s.batch for s in full} == {1, 2, 8, 16} and {s.seq for s in full} == {512, 1024, 8192}
    assert {s.dtype for s in full} == {"bfloat16", "float16"}
    assert all(s.batch <= 2 for s in full if s.seq == 8192)
    assert set(sp.shapes(quick=True)) <= set(full)
    assert not sp.Shape(50257, 1, 16, "bfloat16").staged and sp.Shape(32000, 1, 16, "float16").staged


def test_jobs_put_the_anchors_first_and_fit_the_budget():
    run = sp.jobs(with_configs=True)
    kinds = [j["kind"] for j in run]
    assert kinds[0] == "launch" and kinds.count("launch") == 1
    first_config = kinds.index("configs")
    assert all(j["shape"].seq == 1024 and j["shape"].dtype == "bfloat16" for j in run[1:first_config])
    assert run[1]["shape"] == sp.Shape(128256, 8, 1024, "bfloat16")  # the seed shape is the first timed
    assert {j["shape"] for j in run if j["kind"] == "shape"} == set(sp.shapes())
    # the shape sweep with 12 prewarm processes fits the default budget of 370 s (with --configs the budget
    # cuts the last jobs: seq 512 in fp16), and --quick --configs is a ~3-minute subset
    for_level = _configs()[0].FOR_LEVEL
    shapes_only = sp.jobs()
    assert sp.estimate_total_s(shapes_only, 12, sp.prewarm_items(shapes_only, for_level)) < 370
    assert sp.estimate_total_s(run, 12, sp.prewarm_items(run, for_level)) < 1.1 * 370
    quick = sp.jobs(quick=True, with_configs=True)
    assert sp.estimate_total_s(quick, 12, sp.prewarm_items(quick, for_level)) < 180


def test_prewarm_items_and_buckets():
    for_level = _configs()[0].FOR_LEVEL
    run = sp.jobs(with_configs=True)
    items = sp.prewarm_items(run, for_level)
    assert len(items) == len(set(items))
    ours = {i for i in items if i[3] != "liger"}
    assert all(i[4] == 0 for i in ours)  # ours at one seq whatever the shape's
    assert {(i[0], i[1]) for i in ours} == {(s.vocab, s.dtype) for s in sp.shapes()}
    assert {(i[0], i[1], i[4]) for i in items if i[3] == "liger"} == {(s.vocab, s.dtype, s.seq) for s in sp.shapes()}
    assert not [i for i in sp.prewarm_items(sp.jobs(liger=False), for_level) if i[3] == "liger"]
    buckets = sp.prewarm_buckets(items, 12)
    assert len(buckets) == 12 and sorted(sum(buckets, [])) == sorted(items)
    big = buckets[:sp.BIG_BUCKETS]
    assert all(i[3] == "liger" and i[4] == 8192 for b in big for i in b) and sum(map(len, big)) == 5 * 2 * 3
    assert not [i for b in buckets[sp.BIG_BUCKETS:] for i in b if i[3] == "liger" and i[4] > 1024]
    assert sp.prewarm_buckets(items, 1) == [items] and sorted(sum(sp.prewarm_buckets(items, 2), [])) == sorted(items)


def test_configs_can_cover_fp16_and_the_masked_member():
    """V 32000 kept the shipped launch in fp16 and for the masked members (rules measured in bf16 on token-is
    and GSPO only): --configs-dtypes and --configs-members put them in the comparison, and every count (the
    estimate, the kernel sets compiled ahead) follows the members a job names."""
    for_level = _configs()[0].FOR_LEVEL
    default = [j for j in sp.jobs(with_configs=True) if j["kind"] == "configs"]
    assert {j["shape"].dtype for j in default} == {"bfloat16"} and all(j["members"] == sp.CONFIG_MEMBERS for j in default)
    three = ("token-is", "token-offpolicy-mask", "sequence-offpolicy-mask")
    wide = [j for j in sp.jobs(with_configs=True, config_dtypes=("bfloat16", "float16"), config_members=three)
            if j["kind"] == "configs"]
    assert len(wide) == 2 * len(default) and {j["shape"].dtype for j in wide} == {"bfloat16", "float16"}
    assert {(i[2], i[1]) for i in sp.prewarm_items(wide, for_level)} == {(m, d) for m in three for d in ("bfloat16", "float16")}
    job = wide[0]
    assert sp.estimate_s(job, set()) > sp.estimate_s({**job, "members": sp.CONFIG_MEMBERS}, set())
    with pytest.raises(ValueError, match="token-x"):
        sp.jobs(with_configs=True, config_members=("token-x",))


def test_estimates_count_compiles_once_and_big_shapes_cost_more():
    compiled: set = set()
    big = {"kind": "shape", "shape": sp.Shape(262144, 16, 1024, "bfloat16"), "liger": True}
    small = {"kind": "shape", "shape": sp.Shape(32000, 1, 512, "bfloat16"), "liger": True}
    first = sp.estimate_s(big, compiled)
    sp.estimate_s(small, compiled)
    again = sp.estimate_s(big, compiled)
    assert first > again > sp.estimate_s(small, compiled)  # compiles counted once
    assert sp.reps_for(big["shape"]) < sp.reps_for(sp.Shape(32000, 1, 512, "bfloat16"))


def test_floors():
    s = sp.Shape(1000, 2, 3, "bfloat16")  # 8 rows of 2000 bytes
    fl = sp.floors(s, unmasked_rows=4, copy_bps=1e6)
    assert fl["plain"] == pytest.approx(2 * 8 * 2000 / 1e6 * 1e3)
    assert fl["masked"] == pytest.approx((4 + 8) * 2000 / 1e6 * 1e3)
    assert fl["three_pass"] == pytest.approx((8 + 8) * 2000 / 1e6 * 1e3)
    assert sp.member_floor("token-is", fl) == fl["plain"] and sp.member_floor("sequence-offpolicy-mask", fl) == fl["masked"]


def _row(shape, member, x, liger=None):
    """A row as run_shape writes it: its floor formed from the shape, ours x that floor."""
    from grpo_conform.report.sweep import SweepRow, floor_ms

    v, b, seq, dtype = shape.split()
    r = {"shape": shape, "vocab": int(v[1:]), "batch": int(b[1:]), "seq": int(seq[1:]), "dtype": dtype,
         "member": member, "unmasked_fraction": 0.75, "note": ""}
    floor = floor_ms(SweepRow(**r), 4.3e12)
    r.update(floor_ms=floor, ours_ms=x * floor, ours_x_floor=x, copy_x_floor=1.1)
    if liger:
        r.update(liger_ms=liger * x * floor, speedup_vs_liger=liger)
    return r


def test_table_and_verdicts_on_fake_timings():
    seed = "V128256 b8 s1024 bfloat16"
    rows = [_row(seed, "token-is", 1.10, liger=1.5), _row(seed, "token-offpolicy-mask", 1.14, liger=1.4),
            _row(seed, "sequence-offpolicy-mask", 1.60, liger=0.8),  # slower than Liger, 1.40x the masked one
            {"shape": "V32000 b1 s512 float16", "vocab": 32000, "batch": 1, "seq": 512, "dtype": "float16",
             "member": "token-is", "note": "ours: OOM, skipped"}]
    text = sp.table(rows)
    assert len(text.splitlines()) == len(rows) + 2 and "OOM, skipped" in text and "1.100" in text
    short = sp.summary(rows).splitlines()
    assert len(short) == 2 + 2  # header, one line per shape, legend
    assert " 0.80 " in short[1]  # the slowest speed-up over Liger (GSPO)
    assert "token-is: ours: OOM, skipped" in short[2]
    meta = {"gpu": "NVIDIA H200", "copy_TBps": 4.3, "started": "2026-12-03T00:00:00Z"}
    v = sp.verdicts({"meta": meta, "rows": rows,
                     "launch": [{"impl": "ours", "member": "token-is", "full_wall_ms": 0.11},
                                {"impl": "ours", "member": "sequence-offpolicy-mask", "full_wall_ms": 0.2}]})
    joined = "\n".join(v)
    assert "PASS  token level full ≤ 1.15x the floor: 2/2" in joined
    assert "FAIL  seed shape, batch 8 and 16, ≤ 1.12x: 1/2" in joined  # 1.14 > 1.12
    assert "FAIL  GSPO within 1.2x of token-offpolicy-mask: 0/1" in joined
    assert "FAIL  never slower than Liger: 2/3" in joined
    assert "FAIL  launch-bound full call ≤ 0.12 ms wall: 1/2 (furthest: 0.2000 ms, sequence-offpolicy-mask)" in joined


def _cfg(shape, vocab, member, config, ms, correct=True, level="token"):
    return {"shape": shape, "vocab": vocab, "dtype": "bfloat16", "member": member, "level": level, "config": config,
            "ms": ms, "correct": correct}


def test_proposal_round_trips_through_configs_table():
    configs, _launch = _configs()
    a, b = "V32000 b8 s1024 bfloat16", "V32000 b2 s1024 bfloat16"
    res = [_cfg(a, 32000, "token-is", "shipped", 1.0), _cfg(a, 32000, "token-is", "balanced", 0.90),
           _cfg(a, 32000, "token-is", "s32k", 0.80, correct=False),  # fastest, but its gradient differed
           _cfg(b, 32000, "token-is", "shipped", 1.0), _cfg(b, 32000, "token-is", "balanced", 0.95),
           _cfg(b, 32000, "token-is", "s32k", 0.80),
           _cfg(a, 128256, "token-is", "shipped", 1.0), _cfg(a, 128256, "token-is", "s16k", 0.99),  # noise
           _cfg(a, 128256, "sequence-offpolicy-mask", "shipped", 1.5, level="sequence"),
           _cfg(a, 128256, "sequence-offpolicy-mask", "grad-item", 1.4, level="sequence")]
    best = sp.best_configs(res)
    assert {(b_["shape"], b_["member"]): b_["best"] for b_ in best}[(a, "token-is")] == "balanced"
    assert "balanced" in sp.config_table(best)
    rules, source = sp.propose(res)
    assert [(r["choice"], r["vocab"][0], r["level"]) for r in rules] == [("balanced", 32000, "token"),
                                                                       ("grad-item", 128256, "sequence")]
    namespace = {"Rule": configs.Rule, "tuple": tuple}
    exec(source, namespace)  # the printed TABLE is valid configs.py source
    table = namespace["TABLE"]
    assert table[-1] == configs.Rule("shipped")
    saved = configs.TABLE
    try:
        configs.TABLE = table
        import torch
        assert configs.choose(32000, 8200, torch.bfloat16, "token") is configs.CANDIDATES["balanced"]
        assert configs.choose(32000, 8200, torch.float16, "token") is configs.CANDIDATES["shipped"]
        assert configs.choose(128256, 8200, torch.bfloat16, "sequence") is configs.CANDIDATES["grad-item"]
        assert configs.choose(128256, 8200, torch.bfloat16, "token") is configs.CANDIDATES["shipped"]
    finally:
        configs.TABLE = saved


def test_json_writer(tmp_path):
    out = tmp_path / "sweep.json"
    sp.write_json(str(out), {"rows": [_row("V32000 b1 s512 float16", "token-is", 1.0)], "shape": sp.Shape(32000, 1, 512, "float16")})
    doc = json.loads(out.read_text())
    assert doc["rows"][0]["ours_x_floor"] == 1.0 and doc["shape"]["vocab"] == 32000
    assert not (tmp_path / "sweep.json.tmp").exists()


def test_configs_default_is_the_shipped_launch_except_where_measured():
    configs, launch = _configs()
    import torch

    assert configs.TABLE[-1] == configs.Rule("shipped") and configs.CANDIDATES["shipped"] == configs.Choice()
    measured = {(32000, dt, "token"): "s16k-b1024" for dt in (torch.bfloat16, torch.float16)} | {
        (32000, dt, "sequence"): "stats16k-item" for dt in (torch.bfloat16, torch.float16)}
    for vocab in (32000, 50257, 128256, 262144):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for level in configs.LEVELS:
                choice = configs.choose(vocab, 8200, dtype, level)
                if (vocab, dtype, level) in measured:  # the rules round22's and sweep36c's sweeps measured
                    assert choice is configs.CANDIDATES[measured[vocab, dtype, level]], (vocab, dtype, level)
                    continue
                assert choice.settings(vocab, dtype) == launch.GPU_DEFAULT
                assert choice.tuning_for("tuning-object", vocab) == "tuning-object"
    with configs.forced("balanced"):
        assert configs.choose(128256, 1, torch.bfloat16, "token") is configs.CANDIDATES["balanced"]
    assert configs.choose(128256, 1, torch.bfloat16, "token") is configs.CANDIDATES["shipped"]
    with pytest.raises(KeyError):
        with configs.forced("nope"):
            pass
    assert all(n in configs.CANDIDATES for names in configs.FOR_LEVEL.values() for n in names)


@pytest.mark.parametrize("vocab", [32000, 50257, 128256, 151936, 262144, 4096, 2048, 17])
def test_even_chunks_keep_the_count_and_even_out(vocab):
    configs, _ = _configs()
    for chunk, block in ((10240, 2048), (16384, 2048), (8192, 1024), (16384, 4096)):
        even = configs.even_chunk(vocab, chunk, block)
        n = math.ceil(vocab / max(chunk, block))
        assert even % block == 0 and even <= max(chunk, block)
        assert math.ceil(vocab / even) == n  # as many chunks as before
        assert n * even - vocab < n * block  # the chunks differ by less than a block each


SMOKE = r"""
import json, sys, types
sys.path.insert(0, sys.argv[1] + "/benchmarks"); sys.path.insert(0, sys.argv[1])
import torch
import grpo_conform.hardware as hardware
import grpo_conform.timing as timing
import sweep_logits as sl, sweep_plan as sp
impl, configs = sl.load_impl()
FAKE = {"grad-item": 0.5, "plain-bal": 0.97}

def fake_time(fn, reps, warmup, spin_cycles=0, **_):  # ns per rep: configs.py's forced candidate decides
    fn()
    name = configs._FORCED[-1] if configs._FORCED else "shipped"
    return [int(1e6 * FAKE.get(name, 1.0))] * reps

timing.time_cuda = fake_time
hardware.measure_ceilings = lambda device: types.SimpleNamespace(copy_bytes_per_s=4e12, read_bytes_per_s=4e12)
torch.cuda.get_device_name = lambda *a: "cpu (interpreter)"
sl.run_launch = lambda job, impl, liger: sl.RUN["launch"].append({"impl": "ours", "member": "token-is",
                                                                  "full_wall_ms": 0.1})
shape = sp.Shape(300, 2, 8, "bfloat16")
run = [{"kind": "launch", "shape": shape}, {"kind": "shape", "shape": shape, "liger": False},
       {"kind": "configs", "shape": shape},
       {"kind": "shape", "shape": sp.Shape(1 << 24, 16, 8192, "bfloat16"), "liger": False}]  # past any budget
args = types.SimpleNamespace(out=sys.argv[2], prewarm=2, budget_s=float(sys.argv[3]), no_liger=True)
sl.measure(args, run, 1.0, impl, configs)
"""


@pytest.mark.slow  # ~40-110 s on 2 cores: the interpreter runs every job of one tiny shape, and 2 prewarm processes
def test_sweep_jobs_end_to_end_on_the_cpu(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "sweep.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), SWEEP_DEVICE="cpu", SWEEP_PREWARM_SEQ="8")
    proc = subprocess.run([sys.executable, "-c", SMOKE, str(ROOT), str(out), "300"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["prewarm"]["workers"] == 2 and doc["prewarm"]["notes"] == [], doc["prewarm"]
    configs = _configs()[0]
    assert doc["meta"]["table"] == [configs.rule_source(r) for r in configs.TABLE] and doc["meta"]["copy_TBps"] == 4.0
    assert doc["meta"]["table"][-1] == "Rule('shipped'),"
    assert [r["member"] for r in doc["rows"]] == list(sp.MEMBERS)
    assert all(r["ours_ms"] == 1.0 and r["ours_x_floor"] > 0 and "liger_ms" not in r for r in doc["rows"])
    # the least call (sweep_least.py) beside the token-level rows only, its pass checked and timed
    assert all(("least_ms" in r) == (r["level"] == "token") and "least_error" not in r for r in doc["rows"]), doc["rows"]
    names = [(c["member"], c["config"]) for c in doc["configs"]]
    assert ("sequence-offpolicy-mask", "grad-item") in names and ("token-is", "plain-bal") in names
    assert all(c["correct"] and c["grad_rel_diff"] == 0.0 for c in doc["configs"]), doc["configs"]
    # the fake timer makes grad-item 2x faster: proposed for the sequence level; plain-bal's 3% is proposed too
    assert {(r["choice"], r["level"]) for r in doc["proposal"]["rules"]} == {("grad-item", "sequence"),
                                                                            ("plain-bal", "token")}
    assert "Rule('grad-item', vocab=(300, 300), dtype='bfloat16', level='sequence')" in proc.stdout
    # a 4.4 TB shape would overrun the budget: skipped and named, not run
    assert [(s["shape"], s["why"]) for s in doc["skipped"]] == [("V16777216 b16 s8192 bfloat16", "budget")]
    assert "PASS  launch-bound full call ≤ 0.12 ms wall: 1/1 (furthest: 0.1000 ms, token-is)" in proc.stdout
    # what the report needs to read it and to say which code was timed (grpo_conform/report/sweep.py)
    assert doc["format"] == "grpo-conform-sweep/1" and len(doc["meta"]["identity"]) == 64 and "commit" in doc["meta"]
    from grpo_conform.report.sweep import load_sweeps  # the report reads the run whole: every floor follows from its shape

    (sweep,) = load_sweeps((str(out),))
    assert not sweep.set_aside
    assert proc.stdout.rstrip().splitlines()[-1].startswith("elapsed")


EQUAL = r'''
import importlib, sys, types, dataclasses
import torch
pkg = types.ModuleType("gi"); pkg.__path__ = [sys.argv[1]]; sys.modules["gi"] = pkg
impl = importlib.import_module("gi.impl"); configs = importlib.import_module("gi.configs")
plan = importlib.import_module("gi.plan")
B, S, V = 2, 3, 9000  # rows of 3 gradient chunks of 4096 (the interpreter's tuning), 2 of 8192
g = torch.Generator().manual_seed(3)
x = (torch.randn(B, S + 1, V, generator=g) * 2).to(torch.bfloat16)
ids = torch.randint(0, V, (B, S), generator=g)
adv = torch.tensor([0.7, -1.1])
with torch.no_grad():
    lp = torch.log_softmax(x[:, :S].float(), -1).gather(-1, ids[..., None])[..., 0]
old = lp + 0.05 * torch.randn(B, S, generator=g)
mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
members = {"token": dict(old_logprobs=old, completion_mask=mask, epsilon_high=0.28),
           "sequence": dict(old_logprobs=old, completion_mask=mask, epsilon_high=0.28,
                            importance_sampling_level="sequence")}
base_tuning = impl.cpu_tuning

def run(level, choice, scales=(1.0, 0.25)):
    impl.cpu_tuning = lambda vocab: choice.tuning_for(base_tuning(vocab), vocab)
    impl._PLANS.clear()
    out = []
    for c in scales:  # c = 0.25 after 1: the token level's backward recomputes from the statistics (_grad_kernel)
        leaf = x.clone().requires_grad_(True)
        loss = impl.grpo_loss(leaf, ids, adv, **members[level])
        (loss * c).backward()
        out.append((loss.detach(), leaf.grad))
    impl.cpu_tuning = base_tuning
    return out

for level in ("token", "sequence"):
    ref = run(level, configs.CANDIDATES["shipped"])
    for name in configs.FOR_LEVEL[(level, False)]:
        t = configs.CANDIDATES[name].tuning_for(base_tuning(V), V)
        if t.main_chunk < V:  # the row's programs would wait for each other: never under the interpreter
            print(level, name, t.main_chunk, "not run")
            continue
        got = run(level, configs.CANDIDATES[name])
        for (l0, g0), (l1, g1) in zip(ref, got):
            assert torch.equal(l0, l1) and torch.equal(g0, g1), (level, name)
        print(level, name, t.grad_chunk, t.grad_programs_per_sm, t.main_chunk, "equal")
'''


@pytest.mark.slow  # ~20 s of interpreter
def test_plain_kernel_candidates_equal_the_shipped_launch_in_the_interpreter():
    """The candidates that change the plain kernels (grid and chunk of _grad_kernel, main_chunk) applied to
    the interpreter's tuning: loss and gradient bit for bit those of the shipped launch, both levels, with
    the backward's statistics path run (d loss 0.25 after 1) and rows in several gradient chunks."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", EQUAL, str(ROOT / "implementations" / "triton")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    equal = [line for line in lines if line.endswith("equal")]
    assert len(lines) == 9 and len(equal) == 8, lines  # plain-c8k splits the main kernel's rows: GPU only
    assert {line.split()[2] for line in equal} == {"4096", "8192"}  # rows in 3 and in 2 gradient chunks
    assert any(line.split()[:2] == ["sequence", "grad-item8k"] for line in equal)


COMPILE = r"""
import importlib, json, sys
import torch
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import compile_staged as cs
staged, staged_members, plan, launch = cs.load(sys.argv[1] + "/implementations/triton")
configs = importlib.import_module("gt_compile.configs")
sem = plan.semantics_of(2, 5, has_old=False, has_ref=False, has_mask=False, has_rho=False, epsilon_low=0.2,
                        epsilon_high=0.2, temperature=1.0, loss_type="grpo", importance_sampling_level="token",
                        beta=0.0, max_completion_length=None, delta=None, sampling_ratio_cap=None,
                        num_items_in_batch=None, num_processes=1)
logits = torch.empty((1, 2, 32000), dtype=torch.bfloat16, device="meta")
p = launch.Problem.of(logits, 0.2, 0.2, 1.0)
out, done = {}, {}
for name in sorted(set(configs.FOR_LEVEL[("token", True)] + configs.FOR_LEVEL[("sequence", True)])):
    g = configs.CANDIDATES[name].settings(32000, torch.bfloat16)
    for kind, fn, stage, block, warps, switches in (
            ("member", staged._staged_member_kernel, g.stage_bytes, g.block, g.num_warps,
             staged_members.member_constexprs(sem)),
            ("stats", staged._staged_stats_kernel, g.forward_stage_bytes, g.forward_block, g.forward_stage_warps,
             staged_members.stats_constexprs(sem))):
        shape = launch._staged_shape(logits, p, stage, block, warps)
        key = (kind, tuple(sorted(shape.items())), warps)
        if key not in done:
            done[key] = cs.compile_(name, fn, dict(shape, THREAD_STATS=g.thread_stats, **switches), warps, "*bf16",
                                    "*i64")
        out[f"{kind}-{name}"] = [shape["CHUNK"], shape["NUM_CHUNKS"], done[key]]
print(json.dumps(out))
"""


@pytest.mark.slow  # ~60 s on 2 cores: six distinct staged compiles for sm_90, no GPU
def test_staged_candidates_compile_for_sm90():
    """Every staged launch configs.py can force at V 32000 (bf16) compiles for sm_90 with the installed triton,
    in the shared memory its stage size says (the GPU run checks their gradients against the shipped one)."""
    pytest.importorskip("triton")
    proc = subprocess.run([sys.executable, "-c", COMPILE, str(ROOT)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["member-shipped"] == [10240, 4, 20496] and got["stats-shipped"] == [16384, 2, 32784]
    assert got["member-balanced"] == [8192, 4, 16400]  # 4 even chunks instead of 3 x 10240 + 1280
    assert got["member-s24k"][:2] == [12288, 3] and got["member-s32k"] == [16384, 2, 32784]
    assert got["stats-stats16k-item"][:2] == [8192, 4] and got["stats-stats16k-item"][2] <= 16400 + 64
    for key, (chunk, n, shared) in got.items():
        assert chunk * 2 <= shared <= chunk * 2 + 64 and (n - 1) * chunk < 32000 <= n * chunk, key


