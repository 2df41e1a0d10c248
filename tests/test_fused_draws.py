"""Where and how often the fused operation draws its large tensors (ops/fused_linear/draws.py,
docs/fused-kernel.md "Check time"): the weight is drawn once an input set, in seeded row blocks, by
generators on the tensors' own device; the samples do not depend on the thread count; the drawn values
keep what inputs.py promises; a timed workload draws 5 full input sets (15 for grpo-logits, unchanged)
and a slot refreshed across all three protocols stays finite. Counts, not wall time."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from grpo_conform.checks import timed
from grpo_conform.checks.buffers import InputSlot
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.dtypes import torch_dtype
from grpo_conform.floors import Floor
from grpo_conform.ops import operation_for
from grpo_conform.ops.fused_linear import draws
from grpo_conform.ops.fused_linear.reference import generated_row_stats
from grpo_conform.ops.grpo_logits.generators.token_ids import pool_ids
from grpo_conform.phases import PHASES
from grpo_conform.spec import load_family

ROOT = Path(__file__).resolve().parent.parent
FAMILY = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json")


def _setup(member: str, workload: str = "odd-bf16", axes: dict | None = None):
    spec = FAMILY.member(member)
    w = spec.workload(workload)
    if axes is not None:
        w = w.model_copy(update={"axes": axes})
    return spec, operation_for(spec), spec.resolve(w)


def _large_streams() -> dict:
    """draws.DRAWN summed by (stream kind, device type): a stream's first element is its kind."""
    out: dict = {}
    for (stream, dev), n in draws.DRAWN.items():
        out[(stream[0], dev)] = out.get((stream[0], dev), 0) + n
    return out


@pytest.mark.parametrize("member", ["token-is-bias", "token-offpolicy-mask-kl-ref-weight"])
def test_each_large_tensor_is_drawn_once_by_generators_on_its_own_device(member, monkeypatch):
    """One draw of the weight (V x H samples) an input set, every block's generator made on the device
    of the tensor it fills (a CUDA workload's weight is drawn by CUDA generators: nothing on the host)."""
    spec, op, rw = _setup(member)
    made = []
    real = draws.generator
    monkeypatch.setattr(draws, "generator", lambda device, seed: made.append(torch.device(device)) or real(device, seed))
    draws.reset_counts()
    x = op.generate(spec, rw, 11, "cpu", case=0)
    v, h = x["weight"].shape
    n = x["hidden"].numel() // h
    counts = _large_streams()
    assert counts[(draws.WEIGHT[0], "cpu")] == v * h
    assert counts[(draws.HIDDEN, "cpu")] == n * h  # every row once, whatever its profile
    assert counts.get((draws.BIAS[0], "cpu"), 0) == (v if "bias" in x.tensors else 0)
    assert counts.get((draws.REF_WEIGHT[0], "cpu"), 0) == (v * h if "ref_weight" in x.tensors else 0)
    assert counts.get((draws.REF_HIDDEN[0], "cpu"), 0) == (n * h if "ref_hidden" in x.tensors else 0)
    assert made and all(d == x["weight"].device for d in made)
    blocks = -(-v // draws.block_rows((v, h)))
    assert len(made) >= blocks  # the weight alone: one generator a block of rows


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_workload_draws_its_weight_on_the_gpu():
    spec, op, rw = _setup("token-offpolicy-mask-kl-ref-weight")
    draws.reset_counts()
    x = op.generate(spec, rw, 11, "cuda", case=0)
    v, h = x["weight"].shape
    counts = _large_streams()
    assert counts[(draws.WEIGHT[0], "cuda")] == v * h and counts[(draws.REF_WEIGHT[0], "cuda")] == v * h
    assert not any(dev == "cpu" for (_, dev) in counts)


def test_the_samples_depend_on_the_seed_and_not_on_the_thread_count(monkeypatch):
    spec, op, rw = _setup("token-offpolicy-mask-kl-ref-weight")
    monkeypatch.setattr(draws, "BLOCK", 4096)  # ~10 blocks of the weight [1003, 40]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op.generate(spec, rw, 5, "cpu", case=0)
        torch.set_num_threads(2)
        two = op.generate(spec, rw, 5, "cpu", case=0)
    finally:
        torch.set_num_threads(threads)
    other = op.generate(spec, rw, 6, "cpu", case=0)
    assert all(torch.equal(one[k], two[k]) for k in one.tensors)
    for name in ("weight", "hidden", "ref_weight", "ref_hidden"):
        assert not torch.equal(one[name], other[name]), name
    seeds = {draws.block_seed(s, draws.WEIGHT, j) & 0xFFFFFFFF for s in range(64) for j in range(64)}
    assert len(seeds) == 64 * 64  # torch's CPU generator keeps the low 32 bits: those differ too


def test_the_drawn_values_keep_what_the_generator_promises():
    """weight ~ N(0, 1/H) with unrelated rows; the profiles' logit spreads; a peaked row's target logit
    ~spike above every other logit; the reference lm_head's logits ~N(0, 0.25) from the policy's."""
    axes = {"batch": 2, "seq": 32, "hidden": 256, "vocab": 4096}
    spec, op, rw = _setup("token-offpolicy-mask-kl-ref-weight", "tiny-bf16", axes)
    x = op.generate(spec, rw, 3, "cpu", profiles=("peaked",), case=0)
    w = x["weight"].double()
    assert abs(w.std().item() * math.sqrt(256) - 1) < 0.02 and abs(w.mean().item()) < 1e-3
    rows = w[:64] / w[:64].norm(dim=-1, keepdim=True)
    corr = (rows @ rows.T - torch.eye(64, dtype=torch.float64)).abs().max().item()
    assert corr < 6 / math.sqrt(256)  # independent rows: ~N(0, 1/H) correlations
    h = x["hidden"].double().reshape(-1, 256)
    z = h @ w.T
    ids = x["completion_ids"].reshape(-1)
    target = z.gather(1, ids[:, None]).squeeze(1)
    others = z.scatter(1, ids[:, None], -math.inf).max(dim=1).values
    spike = spec.validation.profile("peaked").spike
    special = torch.isin(ids, torch.tensor(pool_ids(4096)))  # never spiked: tests/test_special_id_rows.py
    assert bool((target - others > spike / 2)[~special].all()) and int((~special).sum()) > 32
    zr = x["ref_hidden"].double().reshape(-1, 256) @ x["ref_weight"].double().T
    assert abs((zr - z).std().item() - 0.5) < 0.05
    for name in ("normal", "wide"):
        y = op.generate(spec, rw, 4, "cpu", profiles=(name,), case=0)
        spread = (y["hidden"].double().reshape(-1, 256) @ y["weight"].double().T).std().item()
        assert abs(spread / spec.validation.profile(name).scale - 1) < 0.1, (name, spread)


def test_a_slot_refreshed_across_all_three_protocols_stays_finite():
    """refresh_spans_protocols: 32 refreshes (2 buffer sets: 3 x (1 + 10) - 1) without a new draw; each
    hidden row's scale moves by at most e^(0.1 x 32); the log-probs and KL terms stay finite in fp32."""
    spec, op, rw = _setup("token-offpolicy-mask-kl")
    model = ReferenceModel.defaults(spec)
    x = op.generate(spec, rw, 8, "cpu", case=0).tensors
    norms = x["hidden"].float().norm(dim=-1)
    rng = random.Random(2)
    for _ in range(32):
        op.refresh(x, rng)
    ratio = x["hidden"].float().norm(dim=-1) / norms
    assert bool(((ratio > math.exp(-3.3)) & (ratio < math.exp(3.3))).all())
    logp = generated_row_stats(x, model.params).logp
    gap = x["ref_logprobs"].double() - logp
    assert bool(torch.isfinite(logp).all()) and bool((gap < 88).all())  # exp(ref - logp) finite in fp32
    assert math.isfinite(op.reference_loss(spec, x, model.params))


def _timing(spec, rw, sets: int) -> timed.WorkloadTiming:
    """A WorkloadTiming over CPU slots whose worker calls are stubbed: only the parent's refreshes run."""
    t = timed.WorkloadTiming.__new__(timed.WorkloadTiming)
    t.spec, t.rw, t.op, t.device, t.rng = spec, rw, operation_for(spec), torch.device("cpu"), random.Random(1)
    t.settings = timed.TimingSettings()
    t.mask_low, t.set_masks = None, {}
    t.floor_of = lambda protocol, mask=None: Floor(protocol, "w", None, False)

    def slot(name: str) -> InputSlot:
        tensors = {i.name: torch.empty(rw.shapes[i.name], dtype=torch_dtype(rw.dtypes.get(i.name, i.dtypes[0])))
                   for i in spec.inputs}
        return InputSlot(name, tensors, {k: torch.empty_like(v) for k, v in tensors.items()})

    t.sets, t.warm = [slot(f"T{j}") for j in range(sets)], slot("TW")
    call = {"event_ns": 1000, "wall_ns": 1200, "pre_ns": 10, "peak_bytes": 1}
    t._batch = lambda names, protocol, copy_from=None, warm=None: ([dict(call) for _ in names], 10_000)
    t._recheck = lambda i, slot, protocol: {"iteration": i, "passed": True}
    return t


@pytest.mark.parametrize("family, member, workload, generated", [
    ("grpo-fused-linear.v1.json", "token-is", "tiny-bf16", 5),  # one full draw a slot a timed workload
    ("grpo.v1.json", "token-offpolicy-mask", "mask-small-bf16", 15),  # grpo-logits: one a slot a protocol
])
def test_a_timed_workload_draws_the_expected_number_of_full_input_sets(family, member, workload, generated,
                                                                      monkeypatch):
    """The three protocols of checks/timed.py with 4 buffer sets and the warm set: 75 fills, of which the
    full generations are 5 where the operation's refresh spans the protocols, 15 where it does not."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    fam = load_family(ROOT / "specs" / family)
    spec = fam.member(member)
    rw = spec.resolve(spec.workload(workload), random.Random(0))
    t = _timing(spec, rw, sets=4)
    PHASES.reset()
    t._filled = set()  # as WorkloadTiming.run starts
    t.ceiling_of = None  # no GEMM ceiling: only the refreshes are counted
    for protocol in t.settings.protocols:
        t._protocol(protocol)
    fills = 3 * (1 + 4 * (1 + -(-t.settings.reps // 4)))  # per protocol: warm, then warmup + passes x 4 sets
    assert PHASES.counts["inputs-generated"] == generated
    assert PHASES.counts["inputs-generated"] + PHASES.counts["inputs-refreshed"] == fills == 75
