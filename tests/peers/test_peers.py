"""Every row of tests/peers/peer_mapping.py through the trainer's own loss function (peer_runners.py),
compared with the float64 reference on drawn cases: an Exact row must agree (loss and dL/dlogits), a
NotExpressible row's nearest setting must differ where its `where` draw says. Run: pytest -m peers."""

from __future__ import annotations

import pytest
import torch

from peers.peer_lane import RESULTS, reference, require
from member_cases import member_names, member_spec
from peer_draws import cases
from peer_mapping import MAPPING, Exact, NotExpressible
from peer_runners import RUNNERS, TRAINER_OF

pytestmark = pytest.mark.peers

# float64 routes agree to rounding; Liger's fused route computes in float32 (log-softmax, ratio, sums)
TOLERANCE = {"trl": 1e-9, "liger-torch": 1e-9, "verl": 1e-9, "liger-fused": 2e-5}
DIFFERS = 1e-3  # a NotExpressible nearest setting differs by more than this on some drawn case


def _errors(route, flags, spec, x, values):
    ref = reference()
    p = ref.GrpoParameters.from_spec(spec, values)
    loss, grad = RUNNERS[route](flags, x, values)
    ref_loss = ref.reference_loss(x, p)
    ref_grad = ref.reference_gradient_dense(x, p)
    loss_err = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
    grad_err = float((grad - ref_grad).norm() / ref_grad.norm().clamp_min(1e-300))
    return loss_err, grad_err if torch.isfinite(torch.tensor(grad_err)) else float("inf")


@pytest.mark.parametrize("member", member_names())
@pytest.mark.parametrize("route", list(RUNNERS))
def test_trainer_route_against_the_reference(route, member):
    row = MAPPING.get(member, {}).get(TRAINER_OF[route])
    assert row is not None, f"tests/peers/peer_mapping.py has no {TRAINER_OF[route]} row for member {member}"
    require(route)
    spec = member_spec(member)
    if isinstance(row, Exact):
        worst = (0.0, 0.0)
        for seed, x, values in cases(spec):
            loss_err, grad_err = _errors(route, row.flags, spec, x, values)
            worst = (max(worst[0], loss_err), max(worst[1], grad_err))
        tol = max(TOLERANCE[route], row.float32_constants or 0.0)
        ok = worst[0] <= tol and worst[1] <= tol
        RESULTS[(route, member)] = (f"{'pass' if ok else 'DIFFERS'} (loss rel {worst[0]:.1e}, "
                                    f"grad rel {worst[1]:.1e}; 3 draws)")
        assert ok, f"{route} with {dict(row.flags)} is not {member}: loss rel {worst[0]:.3g}, grad rel {worst[1]:.3g}"
        return
    assert isinstance(row, NotExpressible)
    if not row.nearest:
        RESULTS[(route, member)] = f"not expressible: {row.reason}"
        pytest.skip(f"{route}: {member} not expressible: {row.reason}")
    worst = (0.0, 0.0)
    for seed, x, values in cases(spec, where=row.where):
        loss_err, grad_err = _errors(route, row.nearest, spec, x, values)
        worst = (max(worst[0], loss_err), max(worst[1], grad_err))
    RESULTS[(route, member)] = (f"not expressible (nearest differs where {row.where}: loss rel up to "
                                f"{worst[0]:.1e}, grad rel {worst[1]:.1e})")
    assert max(worst) > DIFFERS, (f"{route}'s nearest setting {dict(row.nearest)} equals {member} where "
                                  f"{row.where}: the row says not expressible, the draws say otherwise")


def test_the_lane_can_fail_trl_default_kl_is_not_the_kl_member():
    """TRL 1.16's default use_bias_correction_kl=True (the k3 term times the ratio) is not
    token-offpolicy-mask-kl: leaving the flag out of the row must fail the comparison (issue 33)."""
    require("trl")
    spec = member_spec("token-offpolicy-mask-kl")
    worst = max(max(_errors("trl", {"loss_type": "grpo", "beta": "=beta"}, spec, x, values))
                for _, x, values in cases(spec))
    assert worst > DIFFERS, worst


def test_the_lane_can_fail_trl_default_vllm_mode_is_not_the_vllm_member():
    """TRL 1.16's default vllm_importance_sampling_mode="sequence_mask" is not vllm-is-mask (issue 33)."""
    require("trl")
    spec = member_spec("vllm-is-mask")
    flags = {"loss_type": "grpo", "use_vllm": True, "vllm_importance_sampling_clip_max": "=sampling_ratio_cap",
             "importance_sampling_ratio": "@trl_is_sequence_mask"}
    worst = max(max(_errors("trl", flags, spec, x, values)) for _, x, values in cases(spec))
    assert worst > DIFFERS, worst
