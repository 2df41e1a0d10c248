"""Entry point of implementations/triton for every member it declares (implementation.toml).

Seed call: `grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature)`.
Family members add keyword inputs (`old_logprobs`, `ref_logprobs`, `completion_mask`,
`sampling_ratio`, each [batch, seq]) and parameters (`loss_type`, `importance_sampling_level`,
`beta`, `max_completion_length`, `delta`, `sampling_ratio_cap`, `num_items_in_batch`,
`num_processes`, TRL 1.16's `use_bias_correction_kl`, `vllm_importance_sampling_mode`,
`gradient_accumulation_steps`, `steps_per_generation`, and `sapo_temperature_pos/neg`, `vespo_k_pos`,
`vespo_lambda_pos`, `vespo_k_neg`, `vespo_lambda_neg`). Returns a 0-d float32 loss, differentiable w.r.t. logits.

Per call: one dictionary look-up for the plan of this shape/member/stream (plan.py), then the
kernels. Kernels in members.py (plain Triton) and staged.py (Gluon, CUDA), autograd in function.py.
"""

import torch

from .function import GrpoLossFunction
from .plan import GPU_TUNING, Plan, cpu_tuning, interpreting, semantics_of

_PLANS: dict = {}


def _stream(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def _tag(t):
    return None if t is None else (t.dtype, t.data_ptr() % 16)


def _flat(t):
    return None if t is None else t.contiguous()


def grpo_loss(logits, completion_ids, advantages, epsilon_low=0.2, epsilon_high=0.2, temperature=1.0, *,
              old_logprobs=None, ref_logprobs=None, completion_mask=None, sampling_ratio=None, loss_type="grpo",
              importance_sampling_level="token", beta=0.0, max_completion_length=None, delta=None,
              sampling_ratio_cap=None, num_items_in_batch=None, num_processes=1, use_bias_correction_kl=False,
              vllm_importance_sampling_mode="token_truncate", gradient_accumulation_steps=None,
              steps_per_generation=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
              vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0):
    if logits.dim() != 3 or completion_ids.dim() != 2 or logits.shape[1] != completion_ids.shape[1] + 1:
        raise ValueError(f"logits must be [batch, seq + 1, vocab] for completion_ids [batch, seq]; got "
                         f"{tuple(logits.shape)} and {tuple(completion_ids.shape)}")
    if not logits.is_contiguous():
        # Views (offset rows, padded vocabularies) are copied: the validator's input-layouts check
        # found wrong rows at the seed batches 8 and 16 with strided logits on the H200
        # (2026-12-01); one copy of the logits is the price of a view until that path is fixed.
        logits = logits.contiguous()
    ids, adv = completion_ids.contiguous(), advantages.contiguous()
    old, ref, mask, rho = _flat(old_logprobs), _flat(ref_logprobs), _flat(completion_mask), _flat(sampling_ratio)
    device = logits.device
    stream = _stream(device)
    # Everything the compiled kernels are specialised on is in the key (fastlaunch.py): shapes, strides,
    # dtypes and each pointer's 16-byte alignment.
    key = (logits.shape, logits.stride(), logits.dtype, device, stream, _tag(logits), _tag(ids), _tag(adv), _tag(old),
           _tag(ref), _tag(mask), _tag(rho), float(epsilon_low),
           float(epsilon_high), float(temperature), loss_type, importance_sampling_level, beta,
           max_completion_length, delta, sampling_ratio_cap, num_items_in_batch, num_processes,
           use_bias_correction_kl, vllm_importance_sampling_mode, gradient_accumulation_steps, steps_per_generation,
           sapo_temperature_pos, sapo_temperature_neg, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg)
    plan = _PLANS.get(key)
    if plan is None:
        batch, seq = completion_ids.shape
        for name, t in (("old_logprobs", old), ("ref_logprobs", ref), ("completion_mask", mask),
                        ("sampling_ratio", rho)):
            if t is not None and tuple(t.shape) != (batch, seq):
                raise ValueError(f"{name} must be [batch, seq] = {(batch, seq)}; got {tuple(t.shape)}")
        sem = semantics_of(batch, seq, has_old=old is not None, has_ref=ref is not None, has_mask=mask is not None,
                           has_rho=rho is not None, epsilon_low=epsilon_low, epsilon_high=epsilon_high,
                           temperature=temperature, loss_type=loss_type,
                           importance_sampling_level=importance_sampling_level, beta=beta,
                           max_completion_length=max_completion_length, delta=delta,
                           sampling_ratio_cap=sampling_ratio_cap, num_items_in_batch=num_items_in_batch,
                           num_processes=num_processes, use_bias_correction_kl=use_bias_correction_kl,
                           vllm_importance_sampling_mode=vllm_importance_sampling_mode,
                           gradient_accumulation_steps=gradient_accumulation_steps,
                           steps_per_generation=steps_per_generation, sapo_temperature_pos=sapo_temperature_pos,
                           sapo_temperature_neg=sapo_temperature_neg, vespo_k_pos=vespo_k_pos,
                           vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg, vespo_lambda_neg=vespo_lambda_neg)
        tuning = cpu_tuning(logits.shape[-1]) if device.type != "cuda" or interpreting() else GPU_TUNING
        if tuning.interp_rows and interpreting():  # the CPU interpreter: interp.py's plan (never on CUDA)
            from .interp import InterpPlan
            plan = _PLANS[key] = InterpPlan(logits, sem, tuning, stream)
        else:
            plan = _PLANS[key] = Plan(logits, sem, tuning, stream)
    # Absent inputs: any tensor of this device stands in (the kernels never read it).
    others = (ids, adv, adv if old is None else old, adv if ref is None else ref, ids if mask is None else mask,
              adv if rho is None else rho)
    if not (torch.is_grad_enabled() and logits.requires_grad):
        # No graph will be built (needs_input_grad ignores torch.no_grad): the loss alone.
        return plan.forward((logits,) + others)
    return GrpoLossFunction.apply(logits, plan, others)
