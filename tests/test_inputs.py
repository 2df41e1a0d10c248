"""Seeded input generation, driven by the spec: shapes and dtypes, edge token ids, advantages with
both signs and a clear mean, reproducibility, in-place writing, adversarial profiles."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.compare import bitwise_equal
from grpo_conform.ops.grpo_logits.inputs import allocate, clone_inputs, dtype_name, fill_advantages, generate, torch_dtype

CPU_WORKLOADS = ["small-bf16", "odd-vocab", "batch1-seq1", "fp32-small", "fp16-small", "drawn-bf16"]


@pytest.mark.parametrize("name", CPU_WORKLOADS)
def test_shapes_and_dtypes_follow_the_resolved_workload(spec, name):
    rw = spec.resolve(spec.workload(name), random.Random(3))
    x = generate(spec, rw, seed=11, device="cpu")
    assert set(x.tensors) == {"logits", "completion_ids", "advantages"}
    for t in spec.inputs:
        assert tuple(x[t.name].shape) == rw.shapes[t.name]
        assert x[t.name].dtype == torch_dtype(rw.dtypes.get(t.name, t.dtypes[0]))
    assert dtype_name(x["logits"].dtype) == spec.workload(name).dtypes["logits"]
    assert x["completion_ids"].dtype == torch.int64
    vocab = rw.axes["vocab"]
    assert int(x["completion_ids"].min()) >= 0 and int(x["completion_ids"].max()) < vocab
    assert torch.isfinite(x["logits"].float()).all()
    assert x.seed == 11 and x.profiles == tuple(spec.validation.base_profiles)


@pytest.mark.parametrize("name", ["small-bf16", "odd-vocab", "fp16-small"])
def test_special_ids_are_a_drawn_subset_sometimes_none(spec, name):
    rw = spec.resolve(spec.workload(name))
    vocab = rw.axes["vocab"]
    seen, without, sizes = set(), 0, set()
    for seed in range(80):
        x = generate(spec, rw, seed, "cpu")
        ids = set(x["completion_ids"].flatten().tolist())
        labels = x.covered["special_ids"]
        for label in labels:  # what the record says was placed is there
            assert (int(label) if not label.startswith("V") else vocab + int(label[1:])) in ids
        seen |= set(labels)
        without += not labels
        sizes.add(len(labels))
        assert not {0, 1, 2, vocab - 2, vocab - 1} <= ids  # the old fixed signature never appears whole
    assert seen == {"0", "1", "2", "3", "V-4", "V-3", "V-2", "V-1"} and 5 <= without <= 40 and sizes == {0, 1, 2, 3, 4}
    first = [generate(spec, rw, seed, "cpu", case=0).covered["special_ids"] for seed in range(20)]
    assert all(first)  # call A always meets at least one


def test_a_single_token_is_sometimes_a_special_id(spec):
    rw = spec.resolve(spec.workload("batch1-seq1"))
    vocab = rw.axes["vocab"]
    assert rw.numel("completion_ids") == 1
    seen = [int(generate(spec, rw, seed, "cpu")["completion_ids"]) for seed in range(40)]
    special = {0, 1, 2, 3, vocab - 4, vocab - 3, vocab - 2, vocab - 1}
    assert any(v in special for v in seen) and any(v not in special for v in seen) and len(set(seen)) >= 8


@pytest.mark.parametrize("batch", [2, 3, 4, 8, 16])
def test_advantages_have_both_signs_and_a_clear_mean(spec, batch):
    for seed in range(200):
        adv = torch.empty(batch)
        fill_advantages(adv, spec, torch.Generator().manual_seed(seed))
        assert (adv < 0).any() and (adv > 0).any(), seed
        mean, mean_abs = abs(float(adv.double().mean())), float(adv.double().abs().mean())
        # A dropped sign changes the loss by mean|A| - mean(A): far beyond the loss tolerance.
        assert mean >= 0.05 * mean_abs, seed


def test_advantage_mean_guard_reaches_its_own_threshold(spec):
    for seed in range(200):
        adv = torch.empty(2)
        fill_advantages(adv, spec, torch.Generator().manual_seed(seed))
        assert abs(float(adv.double().mean())) >= 0.25 * float(adv.double().abs().mean()), seed


def test_a_single_advantage_is_never_zero_and_takes_every_magnitude_class(spec):
    seen = set()
    for seed in range(60):
        adv = torch.empty(1)
        kinds = fill_advantages(adv, spec, torch.Generator().manual_seed(seed))
        a = abs(float(adv))
        assert a > 0
        seen |= set(kinds)
        if "exact-tiny" in kinds:
            assert math.log2(a) == int(math.log2(a)) and a < 0.04
        if "tiny" in kinds:
            assert 1e-6 <= a < 0.04
    assert seen == {"tiny", "exact-tiny", "group", "ordinary"}


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 8])
def test_small_advantages_at_every_batch_size(spec, batch):
    """The review's kernel zeroing sequences with |A| < 0.04 passed batch 2: every batch size now has
    a small advantage in call A (case 0), and call D (case 1) too from batch 2 up."""
    for seed in range(30):
        for case in (0, 1):
            adv = torch.empty(batch)
            fill_advantages(adv, spec, torch.Generator().manual_seed(seed), case=case)
            small = ((adv.abs() < 0.04) & (adv != 0)).any()
            if case == 0 or batch >= 2:
                assert small, (seed, case, adv)
            if batch >= 2:
                assert (adv < 0).any() and (adv > 0).any()
                assert abs(float(adv.double().mean())) >= 0.25 * float(adv.double().abs().mean()) - 1e-12


def test_same_seed_same_tensors_other_seed_other_tensors(spec):
    rw = spec.resolve(spec.workload("odd-vocab"))
    a = generate(spec, rw, 77, "cpu")
    b = generate(spec, rw, 77, "cpu")
    c = generate(spec, rw, 78, "cpu")
    for name in a.tensors:
        assert bitwise_equal(a[name], b[name]), name
        assert not torch.equal(a[name], c[name]), name


def test_profiles_change_the_values(spec):
    rw = spec.resolve(spec.workload("odd-vocab"))
    base = generate(spec, rw, 5, "cpu")
    adversarial = generate(spec, rw, 5, "cpu", profiles=spec.validation.adversarial_profiles)
    assert torch.equal(base["completion_ids"], adversarial["completion_ids"])
    assert torch.equal(base["advantages"], adversarial["advantages"])
    assert not torch.equal(base["logits"], adversarial["logits"])


def test_out_writes_in_place(spec):
    rw = spec.resolve(spec.workload("fp32-small"))
    buffers = allocate(rw, spec, "cpu")
    for t in buffers.values():
        t.fill_(-7)
    pointers = {k: v.data_ptr() for k, v in buffers.items()}
    x = generate(spec, rw, 9, "cpu", out=buffers)
    assert x.tensors is buffers
    for name, t in buffers.items():
        assert t.data_ptr() == pointers[name]
        assert not (t == -7).all(), name
    fresh = generate(spec, rw, 9, "cpu")
    for name in buffers:
        assert torch.equal(buffers[name], fresh[name])
    again = generate(spec, rw, 10, "cpu", out=buffers)
    assert buffers["logits"].data_ptr() == pointers["logits"] and not torch.equal(again["logits"], fresh["logits"])


def test_clone_inputs_is_a_deep_copy(spec):
    rw = spec.resolve(spec.workload("batch1-seq1"))
    x = generate(spec, rw, 3, "cpu")
    y = clone_inputs(x)
    for name in x.tensors:
        assert torch.equal(x[name], y[name]) and x[name].data_ptr() != y[name].data_ptr()
    assert (y.seed, y.profiles) == (x.seed, x.profiles)


def test_peaked_rows_spike_at_the_target(spec):
    rw = spec.resolve(spec.workload("odd-vocab"))
    x = generate(spec, rw, 4, "cpu", profiles=["peaked"])
    logits, ids = x["logits"].float(), x["completion_ids"]
    seq = ids.shape[1]
    target = logits[:, :seq, :].gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert (target > 25).all()
    assert (logits[:, :seq, :].argmax(-1) == ids).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_adversarial_profiles_reach_1e4_and_stay_finite(spec, dtype):
    rw = spec.resolve(spec.workload("odd-vocab"))
    rw.dtypes["logits"] = dtype  # the same shape in each floating dtype the input allows
    x = generate(spec, rw, 21, "cpu", profiles=spec.validation.adversarial_profiles)
    logits = x["logits"]
    assert logits.dtype == torch_dtype(dtype)
    values = logits.float()
    assert torch.isfinite(values).all()
    assert float(values.abs().max()) >= 9000  # the 'large' profile is clamped at 1e4
    large_rows = (values.abs() >= 5000).sum(-1) > 100
    assert large_rows.any()
    if dtype == "float16":
        assert float(values.abs().max()) <= torch.finfo(torch.float16).max / 4


def test_heavy_tails_are_clamped_for_float16(spec, monkeypatch):
    """Without the clamp, a Student t sample far beyond 65504 would become Inf in float16."""
    rw = spec.resolve(spec.workload("fp16-small"))
    real = gen._sample

    def huge(profile, n, vocab, g, device):
        x = real(profile, n, vocab, g, device)
        x[:, 0] = 1e9
        x[:, 1] = -1e9
        return x

    monkeypatch.setattr(gen, "_sample", huge)
    logits = generate(spec, rw, 1, "cpu")["logits"]
    assert torch.isfinite(logits).all()
    assert float(logits.float().abs().max()) == pytest.approx(torch.finfo(torch.float16).max / 4, rel=1e-3)


def test_logits_are_filled_without_waiting_for_the_device(monkeypatch, spec):
    """Which rows each profile's draw fills is worked out on the host from one copy of the row order, and
    the rows go to the device in one copy: no boolean-mask index or nonzero on the logits' device (each
    made the host wait for the GPU, ~200 times a batch-8 input set). The values are those of the
    boolean-mask version (same generator stream, checked against it when this changed)."""
    from device_reads import DeviceReads

    host_side = gen._row_selections
    monkeypatch.setattr(gen, "_row_selections", lambda *a: _outside_the_count(host_side, *a))
    monkeypatch.setattr(gen, "CHUNK_ELEMENTS", 700 * 5)  # several chunks, every profile in each
    logits = torch.empty(3, 9, 700, dtype=torch.bfloat16)
    ids = torch.randint(0, 700, (3, 8))
    with DeviceReads() as reads:
        gen.fill_logits(logits, ids, spec, spec.validation.adversarial_profiles, torch.Generator().manual_seed(4))
    assert reads.reads == [] and torch.isfinite(logits.float()).all()
    assert (logits.float().amax(dim=-1) > 30).any()  # peaked rows were drawn, with their spike


def _outside_the_count(fn, *args):
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # the host's own work on its copy of the row order: not the device's
        return fn(*args)
