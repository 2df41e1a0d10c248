"""The float64 reference: closed form against autograd, the facts of the seed workload (loss is
-mean(A), last position 0, rows sum to 0), chunking, temperature, A = 0, large logits, row scales."""

from __future__ import annotations

import pytest
import torch

from grpo_conform.ops.grpo_logits.reference import (
    GrpoParameters,
    reference_gradient,
    reference_gradient_dense,
    reference_loss,
    chunked_gradient,
    reference_logprobs,
    chunked_loss,
    row_scales,
    rows_per_chunk,
)


def _x(logits, ids, adv):
    return {"logits": logits, "completion_ids": ids, "advantages": adv}

SPEC_PARAMS = GrpoParameters(0.2, 0.2, 1.0)


def _inputs(batch, seq, vocab, seed=0, dtype=torch.bfloat16, scale=3.0, adv=None):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, seq + 1, vocab, generator=g) * scale).to(dtype)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if adv is None:
        adv = torch.randn(batch, generator=g) + 0.5
        adv[0] = -abs(float(adv[0])) - 0.1
    return logits, ids, torch.as_tensor(adv, dtype=torch.float32)


def _autograd(logits, ids, adv, p: GrpoParameters):
    """The eager GRPO loss in float64 on a float64 leaf, old = logp.detach(); returns (loss, grad)."""
    leaf = logits.detach().to(torch.float64).requires_grad_(True)
    seq = ids.shape[1]
    z = leaf[:, :seq, :] / p.temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = adv.to(torch.float64).unsqueeze(-1)
    clipped = torch.clamp(ratio, 1 - p.epsilon_low, 1 + p.epsilon_high)
    per_token = -torch.minimum(ratio * a, clipped * a)
    loss = (per_token.sum(-1) / seq).mean()
    loss.backward()
    return float(loss.detach()), leaf.grad


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


SHAPES = [(1, 1, 7), (2, 3, 5003), (3, 5, 129), (4, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{s}x{v}" for b, s, v in SHAPES])
def test_closed_form_matches_autograd(shape):
    logits, ids, adv = _inputs(*shape, seed=sum(shape))
    loss, grad = _autograd(logits, ids, adv, SPEC_PARAMS)
    ref = reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)
    assert ref.dtype == torch.float64 and ref.shape == logits.shape
    assert _rel(ref, grad) < 1e-12
    assert (ref - grad).abs().max() <= 1e-12 * grad.abs().max()
    assert reference_loss(logits, ids, adv, SPEC_PARAMS) == pytest.approx(loss, rel=1e-12, abs=1e-15)


def test_the_reference_gradient_is_not_rounded_to_the_input_dtype():
    """A float64 leaf: the gradient has values no bf16 number can hold."""
    logits, ids, adv = _inputs(2, 3, 301)
    ref = reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)
    assert not torch.equal(ref, ref.to(torch.bfloat16).to(torch.float64))
    assert not torch.equal(ref, ref.to(torch.float32).to(torch.float64))


@pytest.mark.parametrize("scale", [0.1, 3.0, 100.0])
def test_loss_is_minus_mean_advantage_whatever_the_logits(scale):
    adv = [-0.75, 1.5, 0.25]
    logits, ids, a = _inputs(3, 4, 257, seed=int(scale * 10), scale=scale, adv=adv)
    assert reference_loss(logits, ids, a, SPEC_PARAMS) == pytest.approx(-sum(adv) / 3, abs=1e-15)
    other = torch.randn(logits.shape).to(logits.dtype) * 50
    assert reference_loss(other, ids, a, SPEC_PARAMS) == pytest.approx(-sum(adv) / 3, abs=1e-15)


def test_last_position_gradient_is_exactly_zero_and_rows_sum_to_zero():
    logits, ids, adv = _inputs(3, 4, 1001, seed=5)
    logits[:, -1, :] = float("nan")  # row S is never read
    ref = reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)
    assert torch.isfinite(ref).all()
    assert torch.equal(ref[:, -1, :], torch.zeros_like(ref[:, -1, :]))
    assert not bool((ref[:, -1, :].view(torch.int64) != 0).any())  # +0.0, not -0.0
    sums = ref[:, :-1, :].sum(-1)
    scales = row_scales(adv, logits.shape[1], SPEC_PARAMS).view(3, 5)[:, :-1]
    assert (sums.abs() <= 1e-12 * scales).all()
    # Every non-last row is non-trivial: the largest element is the target's, of size ~s * (1 - p).
    assert (ref[:, :-1, :].abs().amax(-1) > 0).all()


def test_loss_ignores_the_last_position():
    logits, ids, adv = _inputs(2, 3, 64, seed=9)
    before = reference_loss(logits, ids, adv, SPEC_PARAMS)
    logits[:, -1, :] = float("nan")
    assert reference_loss(logits, ids, adv, SPEC_PARAMS) == before


def test_gradient_points_along_onehot_minus_softmax():
    logits, ids, adv = _inputs(1, 1, 11, adv=[2.0])
    ref = reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)
    p = torch.softmax(logits[0, 0].double(), -1)
    onehot = torch.zeros(11, dtype=torch.float64)
    onehot[ids[0, 0]] = 1
    expected = -(2.0 / (1 * 1 * 1.0)) * (onehot - p)
    assert torch.allclose(ref[0, 0], expected, rtol=1e-13, atol=0)
    assert ref[0, 0, ids[0, 0]] < 0  # positive advantage: the target's logit goes up under descent


@pytest.mark.parametrize("budget", [1, 8 * 4 * 64 * 3, 10**6])
def test_chunking_does_not_change_the_results(budget):
    logits, ids, adv = _inputs(3, 6, 64, seed=11)
    rows = 3 * 7
    assert rows_per_chunk(64, 1) == 1 and rows_per_chunk(64, 8 * 4 * 64 * 3) == 3
    chunks = list(chunked_gradient(_x(logits, ids, adv), SPEC_PARAMS, budget))
    assert chunks[0].start == 0 and chunks[-1].stop == rows
    assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
    assert len(chunks) == -(-rows // rows_per_chunk(64, budget))
    chunked = torch.cat([c.values for c in chunks]).view(logits.shape)
    scales = torch.cat([c.scale for c in chunks])
    whole = list(reference_gradient(logits, ids, adv, SPEC_PARAMS))
    assert len(whole) == 1
    assert torch.equal(chunked, whole[0].values.view(logits.shape))
    assert torch.equal(scales, whole[0].scale)
    assert chunked_loss(_x(logits, ids, adv), SPEC_PARAMS, budget) == pytest.approx(
        reference_loss(logits, ids, adv, SPEC_PARAMS), rel=1e-15, abs=1e-16)


def test_chunk_scale_is_the_row_scale():
    logits, ids, adv = _inputs(2, 3, 50, seed=2)
    chunks = list(chunked_gradient(_x(logits, ids, adv), SPEC_PARAMS, 1))
    assert len(chunks) == 8
    scales = torch.cat([c.scale for c in chunks])
    assert torch.allclose(scales, row_scales(adv, 4, SPEC_PARAMS), rtol=1e-14, atol=0)
    grad = torch.cat([c.values for c in chunks])
    assert (grad.abs().amax(-1) <= scales).all()


@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_temperature(temperature):
    p = GrpoParameters(0.2, 0.2, temperature)
    logits, ids, adv = _inputs(2, 4, 333, seed=3)
    loss, grad = _autograd(logits, ids, adv, p)
    ref = reference_gradient_dense(logits, ids, adv, p)
    assert _rel(ref, grad) < 1e-12
    assert reference_loss(logits, ids, adv, p) == pytest.approx(loss, rel=1e-12)
    # The temperature divides the gradient and sharpens the softmax: not the T = 1 gradient.
    assert _rel(ref, reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)) > 0.05
    scales = row_scales(adv, 5, p).view(2, 5)
    assert torch.allclose(scales[:, 0], adv.abs().double() / (2 * 4 * temperature), rtol=1e-15)


def test_zero_advantage_gives_exactly_zero_gradient():
    logits, ids, adv = _inputs(3, 4, 500, seed=4, adv=[0.0, 1.25, -0.5])
    ref = reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)
    assert torch.equal(ref[0], torch.zeros_like(ref[0]))
    assert (ref[1:, :-1].abs().amax(-1) > 0).all()
    zero = torch.zeros(3)
    assert torch.equal(reference_gradient_dense(logits, ids, zero, SPEC_PARAMS), torch.zeros_like(ref))
    assert reference_loss(logits, ids, zero, SPEC_PARAMS) == 0.0


def test_large_logits_stay_finite_and_match_autograd():
    logits, ids, adv = _inputs(2, 3, 777, seed=6, scale=1.0)
    logits = (logits.float() * 3000).clamp(-1e4, 1e4)  # float32 holds 1e4 exactly
    logits[0, 0, :] = 1e4  # a row of equal huge values: a uniform softmax
    logits[1, 1, ids[1, 1]] = -1e4  # the target at the bottom: p ~ 0, gradient ~ -s at the target
    assert logits.abs().max() == 1e4
    ref = reference_gradient_dense(logits, ids, adv, SPEC_PARAMS)
    loss = reference_loss(logits, ids, adv, SPEC_PARAMS)
    assert torch.isfinite(ref).all() and loss == pytest.approx(-float(adv.double().mean()), abs=1e-15)
    _, grad = _autograd(logits, ids, adv, SPEC_PARAMS)
    assert _rel(ref, grad) < 1e-12
    # dL/dz = -(A/(B*S)) * (onehot - p): off the target A*p/(B*S) with p = 1/777 on the uniform row.
    a0 = float(adv[0]) / (2 * 3)
    uniform = ref[0, 0].clone()
    assert float(uniform[ids[0, 0]]) == pytest.approx(-a0 * (1 - 1 / 777), rel=1e-12)
    uniform[ids[0, 0]] = a0 / 777
    assert torch.allclose(uniform, torch.full_like(uniform, a0 / 777), rtol=1e-12, atol=0)
    a1 = float(adv[1]) / (2 * 3)
    assert float(ref[1, 1, ids[1, 1]]) == pytest.approx(-a1, rel=1e-12)


def test_row_scales():
    adv = torch.tensor([-0.5, 2.0, 0.0, 1.25])
    seq_next = 4
    scales = row_scales(adv, seq_next, SPEC_PARAMS)
    assert scales.dtype == torch.float64 and scales.shape == (4 * seq_next,)
    expected = (adv.abs().double() / (4 * 3 * 1.0)).repeat_interleave(seq_next)
    expected[seq_next - 1 :: seq_next] = 0.0
    assert torch.allclose(scales, expected, rtol=1e-15, atol=0)  # w = m/(B*n_b) times |A|: one rounding apart
    assert torch.equal(scales.view(4, seq_next)[:, -1], torch.zeros(4, dtype=torch.float64))
    one = row_scales(torch.tensor([3.0]), 2, SPEC_PARAMS)
    assert one.tolist() == [3.0, 0.0]


def test_off_policy_clip_branch_is_not_reached_on_policy():
    """With eps = 0 the clip range is the single point r = 1: ties count as active, so the gradient is unchanged."""
    logits, ids, adv = _inputs(2, 3, 100, seed=8)
    tight = GrpoParameters(0.0, 0.0, 1.0)
    assert torch.equal(reference_gradient_dense(logits, ids, adv, tight),
                       reference_gradient_dense(logits, ids, adv, SPEC_PARAMS))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunks_without_values_carry_what_forms_them(temperature):
    """form=False (the fused comparison's path on CUDA): no values, and FormedRows of each chunk's logits,
    targets and row_coef gives the values form=True makes, bit for bit, on every row but the last
    positions (which `where` sets to 0: the comparison never reads them as expected values)."""
    from grpo_conform.formed_rows import FormedRows

    p = GrpoParameters(0.2, 0.28, temperature)
    logits, ids, adv = _inputs(3, 5, 97, seed=5)
    x = _x(logits, ids, adv)
    flat = logits.reshape(-1, 97)
    targets = torch.full((3, 6), -1, dtype=torch.long)
    targets[:, :5] = ids
    targets = targets.view(-1)
    valued = list(chunked_gradient(x, p, 8 * 4 * 97 * 4))
    bare = list(chunked_gradient(x, p, 8 * 4 * 97 * 4, form=False))
    # without values the float64 budget does not cut the rows (reference.FORMED_CHUNK_ROWS a chunk)
    assert len(valued) > 1 and [(b.start, b.stop) for b in bare] == [(0, 18)]
    (b,) = bare
    assert b.values is None
    assert torch.equal(torch.cat([a.scale for a in valued]), b.scale)
    assert torch.equal(torch.cat([a.row_coef for a in valued]), b.row_coef)
    formed = FormedRows(flat, targets, b.row_coef, temperature).dense()
    keep = targets >= 0
    assert torch.equal(formed[keep], torch.cat([a.values for a in valued])[keep])
    assert (b.row_coef[~keep] == 0).all()


def test_chunks_without_values_stay_within_their_row_limit(monkeypatch):
    """A chunk without values spans at most FORMED_CHUNK_ROWS rows, whole sequences."""
    from grpo_conform.ops.grpo_logits import reference as ref

    monkeypatch.setattr(ref, "FORMED_CHUNK_ROWS", 12)
    logits, ids, adv = _inputs(3, 5, 97, seed=5)
    bare = list(ref.chunked_gradient(_x(logits, ids, adv), GrpoParameters(0.2, 0.28, 1.0), form=False))
    assert [(b.start, b.stop) for b in bare] == [(0, 12), (12, 18)]


def test_chunks_are_cut_without_waiting_for_the_device():
    """Each chunk's per-row coefficients, scales, bounds and targets are slices of padded [B, S] grids:
    no scalar read, nonzero or boolean-mask index per chunk (each makes the host wait for the GPU; the
    boolean-mask version waited ~8 times a chunk). Only the terms, once per call, may read."""
    from device_reads import DeviceReads

    p = GrpoParameters(0.2, 0.28, 0.8)
    logits, ids, adv = _inputs(3, 5, 41, seed=9)
    chunks = chunked_gradient(_x(logits, ids, adv), p, 8 * 4 * 41 * 2, logp_error=torch.full((3, 5), 1e-7,
                                                                                                 dtype=torch.float64))
    first = next(chunks)  # the terms are computed as the first chunk is asked for
    with DeviceReads() as reads:
        rest = list(chunks)
    assert len(rest) >= 8 and reads.reads == []
    assert first.values is not None and all(c.values is not None for c in rest)
    with DeviceReads() as reads:  # the log-probs of an input set (off-policy members), chunk by chunk
        logp = reference_logprobs(_x(logits, ids, adv), p, 8 * 4 * 41 * 2)
    assert reads.reads == [] and logp.shape == (3, 5)
