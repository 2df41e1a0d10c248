"""Entry point of implementations/triton-fused: the lm_head GEMM fused with every GRPO member it declares.

`grpo_fused_linear_loss(hidden [B, T, H], weight [V, H], completion_ids [B, T], advantages [B], *,
bias [V], old_logprobs, ref_logprobs, completion_mask [B, T], ref_weight [V, H], ref_hidden [B, T, H],
ref_bias [V], settings, **parameters)`; parameters as the spec names them (epsilon_low, epsilon_high,
temperature, loss_type, importance_sampling_level, beta, max_completion_length, ...). Returns a 0-d
float32 loss, differentiable w.r.t. hidden, weight and bias. hidden[b, t] predicts completion_ids[b, t]
(no extra position). Layers: kernels.py (Triton), epilogue.py (the forward-only GEMM with the row statistics
in its epilogue), plan.py (the launcher, chunk loop and GEMMs),
function.py (autograd), semantics.py (what is computed, how it is run); docs/fused-kernel.md.
"""

from typing import Optional

import torch

from .function import FusedLinearGrpoFunction
from .plan import FusedPlan, Inputs
from .semantics import FusedSettings, semantics_of

DEFAULT_SETTINGS = FusedSettings()
_PLANS: dict = {}


def _vector(t: Optional[torch.Tensor], dtype=None) -> Optional[torch.Tensor]:
    if t is None:
        return None
    t = t.detach().reshape(-1)
    return (t if dtype is None else t.to(dtype)).contiguous()


def _rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().reshape(-1, t.shape[-1]).contiguous()


def plan_for(hidden, weight, completion_ids, *, has_old, has_ref, has_mask, settings, parameters) -> FusedPlan:
    batch, seq = completion_ids.shape
    key = (tuple(hidden.shape), tuple(weight.shape), hidden.dtype, weight.dtype, hidden.device, has_old, has_ref,
           has_mask, settings, tuple(sorted((k, v) for k, v in parameters.items())))
    plan = _PLANS.get(key)
    if plan is None:
        sem = semantics_of(batch, seq, has_old=has_old, has_ref=has_ref, has_mask=has_mask, parameters=parameters)
        plan = _PLANS[key] = FusedPlan(batch, seq, hidden.shape[-1], weight.shape[0], weight.dtype, hidden.device,
                                       sem, settings)
    return plan


def grpo_fused_linear_loss(hidden, weight, completion_ids, advantages, *, bias=None, old_logprobs=None,
                           ref_logprobs=None, completion_mask=None, ref_weight=None, ref_hidden=None, ref_bias=None,
                           settings: Optional[FusedSettings] = None, **parameters):
    if hidden.dim() != 3 or completion_ids.shape != hidden.shape[:2] or weight.dim() != 2 \
            or weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"expected hidden [B, T, H], completion_ids [B, T], weight [V, H]; got {tuple(hidden.shape)}, "
                         f"{tuple(completion_ids.shape)}, {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise ValueError(f"hidden, weight and bias must share a dtype; got {hidden.dtype}, {weight.dtype}, "
                         f"{None if bias is None else bias.dtype}")
    if ref_logprobs is not None and ref_weight is not None:
        raise ValueError("give either ref_logprobs or ref_weight (the reference log-probs through its lm_head)")
    settings = settings or DEFAULT_SETTINGS
    has_ref = ref_logprobs is not None or ref_weight is not None
    plan = plan_for(hidden, weight, completion_ids, has_old=old_logprobs is not None, has_ref=has_ref,
                    has_mask=completion_mask is not None, settings=settings, parameters=parameters)
    mask = _vector(completion_mask)
    if mask is not None and mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    x = Inputs(hidden=_rows(hidden), weight=weight.detach().contiguous(), bias=_vector(bias),
               ids=_vector(completion_ids, torch.int64), adv=_vector(advantages, torch.float32),
               old=_vector(old_logprobs, torch.float32), ref=_vector(ref_logprobs, torch.float32), mask=mask,
               ref_weight=None if ref_weight is None else ref_weight.detach().to(weight.dtype).contiguous(),
               ref_hidden=None if ref_hidden is None else _rows(ref_hidden.to(hidden.dtype)),
               ref_bias=None if ref_bias is None else _vector(ref_bias, weight.dtype))
    wants = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not wants:  # forward only: the logits GEMM and the loss (no gradient GEMMs)
        return plan.run(x).loss
    return FusedLinearGrpoFunction.apply(hidden, weight, bias, plan, x)
