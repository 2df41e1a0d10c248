"""GradientComparator and friends: what passes, what fails and the evidence each verdict carries."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_conform.compare import (
    GradientComparator,
    bitwise_equal,
    compare_loss,
    first_difference,
    json_float,
    max_abs_diff,
)
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient, row_scales
from grpo_conform.spec import GradientTolerance, LossTolerance

PARAMS = GrpoParameters(0.2, 0.2, 1.0)
B, S, V = 2, 3, 1000
SEQ_NEXT = S + 1


@pytest.fixture(scope="module")
def problem():
    """Logits, ids, advantages and the float64 reference gradient [rows, V] with its row scales."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(B, SEQ_NEXT, V, generator=g) * 2).to(torch.bfloat16)
    ids = torch.randint(0, V, (B, S), generator=g)
    adv = torch.tensor([-0.8, 1.3])
    (chunk,) = reference_gradient(logits, ids, adv, PARAMS)
    return logits, ids, adv, chunk.values, chunk.scale


@pytest.fixture(scope="module")
def tol(spec):
    return spec.tolerance("bfloat16").gradient


def _compare(tol, actual, expected, scale, slack=1.0, step=None) -> GradientComparator:
    cmp = GradientComparator(tol, SEQ_NEXT, V, slack=slack)
    step = step or actual.shape[0]
    for start in range(0, actual.shape[0], step):
        cmp.update(start, actual[start : start + step], expected[start : start + step], scale[start : start + step])
    return cmp


def _target_mask(ids) -> torch.Tensor:
    mask = torch.zeros(B, SEQ_NEXT, V, dtype=torch.bool)
    for b in range(B):
        for t in range(S):
            mask[b, t, ids[b, t]] = True
    return mask.view(-1, V)


def test_identical_gradient_passes(problem, tol):
    _, _, _, expected, scale = problem
    cmp = _compare(tol, expected.clone(), expected, scale)
    assert cmp.passed and cmp.elements_ok and cmp.frobenius_ok
    assert cmp.mismatches == 0 and cmp.nan == 0 and cmp.inf == 0 and cmp.frobenius_rel == 0.0
    assert cmp.elements == B * S * V  # the last position is judged apart
    assert cmp.row_sum_failures == 0 and cmp.last_rows_nonzero == 0
    assert "frobenius rel 0.00e+00" in cmp.describe() and "outside tolerance" not in cmp.describe()
    assert cmp.evidence()["worst"] == []


def test_a_correct_bf16_gradient_passes(problem, tol):
    _, _, _, expected, scale = problem
    cmp = _compare(tol, expected.to(torch.bfloat16), expected, scale)
    assert cmp.passed and cmp.row_sum_failures == 0
    assert 0 < cmp.frobenius_rel < 2**-8


def test_all_zero_gradient_fails_although_its_absolute_error_is_tiny(problem, tol):
    _, _, _, expected, scale = problem
    expected, scale = expected * 0.3, scale * 0.3  # advantages 0.3 times as large: every |element| < 0.1
    zero = torch.zeros_like(expected, dtype=torch.bfloat16)
    # Liger's own tests (atol 5e-2, rtol 0.5) accept this gradient:
    assert float((zero.double() - expected).abs().max()) < 0.1
    assert torch.allclose(zero.double(), expected, atol=5e-2, rtol=0.5)
    cmp = _compare(tol, zero, expected, scale)
    assert not cmp.passed and not cmp.elements_ok and not cmp.frobenius_ok
    assert cmp.mismatches > 0.8 * cmp.elements  # all but elements with p < ~1e-5 (within 1e-5 * s)
    assert cmp.frobenius_rel == pytest.approx(1.0)
    assert cmp.row_sum_failures == 0  # rows of zeros sum to zero: the element check catches it


@pytest.mark.parametrize("how", ["scaled", "random-sign"])
def test_a_4_percent_error_fails(problem, tol, how):
    _, _, _, expected, scale = problem
    if how == "scaled":
        factor = 1.04
    else:
        signs = torch.randint(0, 2, expected.shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
        factor = 1 + 0.04 * signs
    actual = (expected * factor).to(torch.bfloat16)
    cmp = _compare(tol, actual, expected, scale)
    assert not cmp.passed and not cmp.frobenius_ok and cmp.mismatches > 0.2 * cmp.elements
    assert 0.03 < cmp.frobenius_rel < 0.05


def test_a_0_2_percent_error_passes_for_bf16(problem, tol):
    _, _, _, expected, scale = problem
    actual = (expected * 1.002).to(torch.bfloat16)
    cmp = _compare(tol, actual, expected, scale)
    assert cmp.passed, cmp.describe()
    assert cmp.row_sum_failures == 0


def test_float32_tolerances_reject_what_bf16_accepts(problem, spec):
    """The same 0.6% error: within bf16's 1%, beyond fp32's 0.5% per element and 0.1% Frobenius."""
    _, _, _, expected, scale = problem
    actual = expected * 1.006
    assert _compare(spec.tolerance("bfloat16").gradient, actual, expected, scale).passed
    strict = _compare(spec.tolerance("float32").gradient, actual, expected, scale)
    assert not strict.passed and not strict.frobenius_ok and strict.mismatches > 0


def test_slack_widens_every_allowance(problem, tol):
    _, _, _, expected, scale = problem
    actual = expected * 1.015
    assert not _compare(tol, actual, expected, scale).passed
    assert _compare(tol, actual, expected, scale, slack=2.0).passed


def test_nan_and_inf_are_counted_apart_and_nan_is_always_a_mismatch(problem, tol):
    _, _, _, expected, scale = problem
    actual = expected.clone()
    actual[0, 3] = float("nan")
    actual[1, 4] = float("nan")
    actual[5, 6] = float("inf")
    cmp = _compare(tol, actual, expected, scale)
    assert (cmp.nan, cmp.inf, cmp.mismatches) == (2, 1, 3)
    assert not cmp.frobenius_ok and not cmp.passed
    assert math.isfinite(cmp.frobenius_rel)  # non-finite elements are left out of the norm, counted instead
    assert "2 NaN, 1 Inf" in cmp.describe()
    # NaN is a mismatch even when the allowance is astronomically large.
    lax = GradientTolerance(element_rtol=1e300, element_atol_row_scale=1e300, element_atol=1e300,
                            frobenius_rtol=1e300, row_sum_fraction=1e300)
    nan_only = expected.clone()
    nan_only[2, 2] = float("nan")
    cmp = _compare(lax, nan_only, expected, scale)
    assert cmp.mismatches == 1 and cmp.nan == 1 and not cmp.passed
    worst = cmp.evidence()["worst"][0]
    assert worst["actual"] == "nan" and worst["index"] == [0, 2, 2]


def test_worst_offenders_carry_indices_and_values(problem, tol):
    _, _, _, expected, scale = problem
    actual = expected.clone()
    row = 1 * SEQ_NEXT + 2  # b = 1, t = 2
    actual[row, 100] = expected[row, 100] * 3 + scale[row]  # far out
    actual[3, 7] = expected[3, 7] * 1.5  # b = 0, t = 3 is the last position: judged apart
    actual[2, 9] = expected[2, 9] * 1.3 + 0.1 * scale[2]  # b = 0, t = 2: out, less so
    cmp = _compare(tol, actual, expected, scale)
    assert cmp.mismatches == 2
    worst = cmp.evidence()["worst"]
    assert [w["index"] for w in worst] == [[1, 2, 100], [0, 2, 9]]
    first = worst[0]
    assert first["actual"] == pytest.approx(float(actual[row, 100]))
    assert first["expected"] == pytest.approx(float(expected[row, 100]))
    t = tol
    assert first["allowed"] == pytest.approx(t.element_rtol * abs(float(expected[row, 100]))
                                             + t.element_atol_row_scale * float(scale[row]) + t.element_atol)
    assert "worst at [1, 2, 100]" in cmp.describe()
    assert cmp.last_rows_nonzero == 0  # expected[3] is all zero: 1.5 * 0 stays 0


def test_at_most_five_offenders_are_kept_best_first_across_chunks(problem, tol):
    _, _, _, expected, scale = problem
    actual = expected.clone()
    rows = [0, 1, 2, 4, 5, 6]
    for k, r in enumerate(rows):
        actual[r, 10] = expected[r, 10] + (k + 1) * scale[r]
    cmp = _compare(tol, actual, expected, scale, step=1)
    worst = cmp.evidence()["worst"]
    assert len(worst) == 5 and cmp.mismatches == 6
    assert worst[0]["index"] == [1, 2, 10]  # row 6: the largest error
    assert [0, 0, 10] not in [w["index"] for w in worst]  # row 0: the smallest, dropped


def test_chunked_updates_equal_one_update(problem, tol):
    _, _, _, expected, scale = problem
    actual = (expected * 1.01).to(torch.bfloat16)
    actual[0, 0] = 1.0
    one = _compare(tol, actual, expected, scale)
    many = _compare(tol, actual, expected, scale, step=3)
    assert (one.elements, one.mismatches, one.row_sum_failures) == (many.elements, many.mismatches,
                                                                      many.row_sum_failures)
    assert one.frobenius_rel == pytest.approx(many.frobenius_rel, rel=1e-12)
    assert one.evidence()["worst"][0] == many.evidence()["worst"][0]


def test_last_position_nonzero_is_reported_with_the_first_offender(problem, tol):
    _, _, _, expected, scale = problem
    actual = expected.clone()
    actual[1 * SEQ_NEXT + S, 42] = 1e-30  # b = 1, last position
    actual[0 * SEQ_NEXT + S, 5] = -1e-30  # b = 0, last position: first in row order
    actual[0 * SEQ_NEXT + S, 6] = float("nan")
    cmp = _compare(tol, actual, expected, scale)
    assert cmp.last_rows_nonzero == 3
    ev = cmp.last_row_evidence()
    assert ev["nonzero"] == 3
    assert ev["first"] == {"index": [0, S, 5], "actual": -1e-30, "expected": 0.0, "allowed": 0.0}
    assert cmp.mismatches == 0  # the last position is not part of the element check
    negative_zero = expected.clone()
    negative_zero[S, 0] = -0.0  # -0.0 == 0: not a non-zero
    assert _compare(tol, negative_zero, expected, scale).last_rows_nonzero == 0


def test_target_only_gradient_fails_the_row_sums(problem, tol):
    _, ids, _, expected, scale = problem
    actual = torch.where(_target_mask(ids), expected, torch.zeros_like(expected))
    cmp = _compare(tol, actual, expected, scale)
    assert cmp.row_sum_failures == B * S  # every row but the last positions
    ev = cmp.row_sum_evidence()
    assert ev["rows_failing"] == B * S
    row, total = ev["worst"]["row"], ev["worst"]["sum"]
    flat = row[0] * SEQ_NEXT + row[1]
    assert len(row) == 2 and row[1] < S
    assert total == pytest.approx(float(actual[flat].sum()))
    assert ev["worst"]["allowed"] == pytest.approx(tol.row_sum_fraction * float(scale[flat]))
    assert not cmp.passed


def test_softmax_only_gradient_fails_the_row_sums(problem, tol):
    _, ids, _, expected, scale = problem
    actual = torch.where(_target_mask(ids), torch.zeros_like(expected), expected)  # the -onehot term dropped
    cmp = _compare(tol, actual, expected, scale)
    assert cmp.row_sum_failures == B * S and cmp.mismatches >= B * S


def test_a_correct_gradient_has_no_row_sum_failures_and_no_evidence_of_one(problem, tol):
    _, _, _, expected, scale = problem
    cmp = _compare(tol, expected.to(torch.bfloat16), expected, scale)
    assert cmp.row_sum_evidence() == {"rows_failing": 0}
    assert cmp.last_row_evidence() == {"nonzero": 0}


def test_zero_reference_rows_need_exact_zero(problem, tol):
    """A sequence of advantage 0 has s = 0: its gradient rows must be exactly 0."""
    logits, ids, _, _, _ = problem
    adv = torch.tensor([0.0, 1.3])
    (chunk,) = reference_gradient(logits, ids, adv, PARAMS)
    assert torch.allclose(chunk.scale, row_scales(adv, SEQ_NEXT, PARAMS), rtol=1e-14, atol=0)
    actual = chunk.values.clone()
    assert _compare(tol, actual, chunk.values, chunk.scale).passed
    actual[0, 0] = 1e-20
    cmp = _compare(tol, actual, chunk.values, chunk.scale)
    assert cmp.mismatches == 1 and cmp.evidence()["worst"][0]["allowed"] == 0.0


def test_all_zero_reference(tol):
    expected = torch.zeros(SEQ_NEXT, V, dtype=torch.float64)
    scale = torch.zeros(SEQ_NEXT, dtype=torch.float64)
    cmp = _compare(tol, expected.clone(), expected, scale)
    assert cmp.passed and cmp.frobenius_rel == 0.0 and cmp.frobenius_allowed == 0.0
    actual = expected.clone()
    actual[0, 0] = 1e-30
    cmp = _compare(tol, actual, expected, scale)
    assert not cmp.frobenius_ok and cmp.frobenius_rel == math.inf and not cmp.passed
    assert json.dumps(cmp.evidence())  # serializable: inf became a string
    assert cmp.evidence()["frobenius_rel"] == "inf"


def test_evidence_is_plain_json(problem, tol):
    _, _, _, expected, scale = problem
    actual = expected.clone()
    actual[0, 0] = float("nan")
    ev = _compare(tol, actual, expected, scale).evidence()
    assert set(ev) == {"elements", "mismatches", "nan", "inf", "frobenius_rel", "frobenius_allowed",
                       "max_abs_expected", "worst"}
    assert json.loads(json.dumps(ev, allow_nan=False)) == ev
    assert ev["max_abs_expected"] == pytest.approx(float(expected.abs().max()))


# -- loss ------------------------------------------------------------------------------------------
def test_compare_loss():
    tol = LossTolerance(atol=1e-5, rtol=1e-5)
    ok = compare_loss(-0.500004, -0.5, tol)
    assert ok.passed and ok.allowed == pytest.approx(1.5e-5)
    assert not compare_loss(-0.50002, -0.5, tol).passed
    assert not compare_loss(float("nan"), -0.5, tol).passed
    assert not compare_loss(float("inf"), float("inf"), tol).passed  # never finite-equal by accident
    ev = compare_loss(float("nan"), -0.5, tol).to_json()
    assert ev == {"actual": "nan", "expected": -0.5, "abs_error": "nan", "allowed": pytest.approx(1.5e-5)}


# -- helpers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"),
                                             (1.5, 1.5), (-0.0, -0.0), (3, 3.0)])
def test_json_float(value, expected):
    out = json_float(value)
    assert out == expected and type(out) is type(expected)


def test_json_float_of_a_tensor():
    assert json_float(torch.tensor(float("nan"))) == "nan"
    assert json_float(torch.tensor(2.5, dtype=torch.bfloat16)) == 2.5


def _nan_with_payload(payload: int) -> torch.Tensor:
    return torch.tensor([0x7FC00000 | payload], dtype=torch.int32).view(torch.float32)


def test_bitwise_equal():
    zero, negative_zero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.equal(zero, negative_zero)  # what bitwise_equal must not do
    assert not bitwise_equal(zero, negative_zero)
    a, b = _nan_with_payload(5), _nan_with_payload(5)
    assert not torch.equal(a, b)  # NaN != NaN for torch
    assert bitwise_equal(a, b)
    assert not bitwise_equal(a, _nan_with_payload(6))
    x = torch.randn(3, 4).to(torch.bfloat16)
    assert bitwise_equal(x, x.clone())
    assert not bitwise_equal(x, x.float())  # another dtype
    assert not bitwise_equal(x, x.reshape(4, 3))  # another shape
    assert bitwise_equal(x.t(), x.t().contiguous())  # layout does not matter, values do
    ids = torch.arange(6)
    assert bitwise_equal(ids, ids.clone()) and not bitwise_equal(ids, ids.flip(0))


def test_first_difference():
    before = torch.zeros(2, 3)
    now = before.clone()
    assert first_difference(now, before) is None
    now[1, 1] = 7.0
    now[0, 2] = float("nan")
    assert first_difference(now, before) == {"differing": 2, "index": [0, 2], "now": "nan", "before": 0.0}
    signed = before.clone()
    signed[1, 2] = -0.0
    assert first_difference(signed, before) == {"differing": 1, "index": [1, 2], "now": -0.0, "before": 0.0}
    ints = torch.arange(4)
    other = ints.clone()
    other[3] = 9
    assert first_difference(other, ints) == {"differing": 1, "index": [3], "now": 9.0, "before": 3.0}


def test_max_abs_diff():
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 2.5, 2.0], dtype=torch.bfloat16)
    assert max_abs_diff(a, b) == 1.0
    assert max_abs_diff(a, a) == 0.0
    assert max_abs_diff(a.float(), torch.tensor([1.0, 2.0, float("inf")])) == math.inf


def test_max_abs_diff_reports_nan():
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    assert math.isnan(max_abs_diff(a, torch.tensor([1.0, float("nan"), 3.0], dtype=torch.bfloat16)))


def test_row_sums_allow_one_fp32_floor_where_the_row_cannot_be_resolved(problem, tol):
    """A log-sum-exp rounded at the size of max|z|/T scales a whole row's probabilities alike: the row
    sum then misses by about one element floor. Inside the floor passes; ordinary rows (small floor)
    that lose mass still fail."""
    from grpo_conform.compare import fp32_floor

    logits, ids, _, expected, scale = problem
    z = logits.reshape(-1, V)
    off_target = ~_target_mask(ids)
    scaled = torch.where(off_target, expected * 1.05, expected)  # every p of the row 5% high
    sums = (scaled - expected).sum(dim=1).abs()
    huge = torch.full_like(scale, 4e5)  # as if every row had max|z| = 4e5 (a Student-t row)
    floor_huge = fp32_floor(huge[:, None].expand(-1, 2), 1.0, scale)
    floor_plain = fp32_floor(z, 1.0, scale)
    assert bool((sums[scale > 0] > tol.row_sum_fraction * scale[scale > 0]).any())  # the plain allowance fails it

    def run(floor):
        cmp = GradientComparator(tol, SEQ_NEXT, V)
        cmp.update(0, scaled, expected, scale, floor)
        return cmp

    assert run(floor_huge).row_sum_failures == 0
    assert run(floor_plain).row_sum_failures > 0


def test_target_floor_covers_fp32_summation_of_a_dominated_row_only_at_the_target(tol):
    """torch's CPU fp32 log_softmax drops the tail mass one vector lane adds to the max term: on a
    Llama-vocabulary row where one logit dominates, 1 - p_t comes out 1/8 low. Only the target element
    gets the extra allowance, and never more than 1 - p_t of the row scale."""
    from grpo_conform.compare import fp32_floor, fp32_target_floor

    vocab, T = 128256, 2.03
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(2, vocab, generator=g) * 1.5).to(torch.bfloat16)
    z[0, 1] = 40.25  # the dominating target of a peaked row (the H200/CPU finding)
    targets = torch.tensor([1, 7])
    params = GrpoParameters(0.2, 0.2, T)
    (chunk,) = reference_gradient(z[None], targets[None, :1], torch.tensor([0.25]), params)
    expected = chunk.values[0]
    scale = chunk.scale[:1]
    honest = expected[None].clone()
    honest[0, 1] *= 7 / 8  # 1 - p_t an eighth low at the target, as torch's 8-lane fp32 sum gives
    floor = fp32_floor(z[:1], T, scale)
    extra = fp32_target_floor(z[:1], targets[:1], T, scale)
    rest = float(1 - torch.softmax(z[0].double() / T, 0)[1])
    assert 0 < float(extra) <= rest * float(scale) * (1 + 1e-9)

    def run(target):
        cmp = GradientComparator(tol, 2, vocab)
        cmp.update(0, honest, expected[None], scale, floor, target)
        return cmp

    assert run(None).mismatches == 1  # the plain floor does not cover it
    assert run((targets[:1], extra)).mismatches == 0
    wrong = honest.clone()
    wrong[0, 5] += 1e-3 * float(scale)  # a non-target element off by far more than its floor
    cmp = GradientComparator(tol, 2, vocab)
    cmp.update(0, wrong, expected[None], scale, floor, (targets[:1], extra))
    assert cmp.mismatches == 1


def test_loss_floor_widens_a_small_loss_allowance_only_up_to_the_floor():
    from grpo_conform.compare import compare_loss
    from grpo_conform.spec import find_spec

    tol = find_spec("grpo/token-is").tolerance("bfloat16").loss
    assert not compare_loss(1e-4, 0.0, tol).passed or tol.allowed(0.0) >= 1e-4
    assert compare_loss(tol.allowed(0.0) + 1e-6, 0.0, tol, floor=tol.allowed(0.0) + 2e-6).passed
    assert not compare_loss(3e-6 + tol.allowed(0.0), 0.0, tol, floor=tol.allowed(0.0) + 2e-6).passed


def _bitwise_pairs():
    a = torch.randn(50)
    nan = a.clone()
    nan[33] = float("nan")
    zero, negzero = torch.zeros(20), -torch.zeros(20)
    ids = torch.arange(30)
    return [(a, a.clone()), (a, nan), (zero, negzero), (ids, ids.clone()), (a, a[:49]), (nan, nan.clone())]


def test_bitwise_comparisons_of_a_slot_wait_for_the_device_once(monkeypatch):
    """The mutation check compares every input of a slot with its pristine copy after every call: each
    tensor slice by slice on the device, all answers in one read (torch.equal per slice waited 16 times a
    batch-8 tensor). Same answers as before: bytes, NaN payloads and signed zeros included."""
    from device_reads import DeviceReads

    from grpo_conform import compare as C

    monkeypatch.setattr(C, "CHUNK_ELEMENTS", 7)  # several slices per tensor
    pairs_cpu = _bitwise_pairs()
    assert C.bitwise_equal_all(pairs_cpu) == [True, False, False, True, False, True]  # CPU: torch.equal per pair
    monkeypatch.setattr(C, "EQUAL_ON_CPU", False)  # the device path, on CPU tensors
    tolist, reads = torch.Tensor.tolist, []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.numel()) or tolist(self))
    pairs = _bitwise_pairs()
    with DeviceReads() as mode:
        got = C.bitwise_equal_all(pairs)
    assert got == [True, False, False, True, False, True]
    assert mode.reads == [] and reads == [5]  # one read, of the five pairs that could be compared
    assert [C.bitwise_equal(x, y) for x, y in pairs] == got
