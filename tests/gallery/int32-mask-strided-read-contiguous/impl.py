"""implementations/pytorch with one bug (the forty-second session's red team).

Bug: int32 is the kernel's native mask dtype, so an int32 mask is handed to the kernel zero-copy (bool and
int64 masks are converted with .to(torch.int32), which makes them contiguous). The kernel indexes the mask
as if its rows were contiguous (row pitch = seq) from its storage offset; a strided int32 mask is read at
the wrong positions.

Trigger: completion_mask of dtype int32 that is not contiguous (an offset/strided view of a larger buffer).
"""

import math

import torch

_NORMALISED = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}


def _mask(completion_mask, completion_ids):
    if completion_mask is None:
        return torch.ones(completion_ids.shape, dtype=torch.bool, device=completion_ids.device)
    if completion_mask.dtype == torch.int32 and not completion_mask.is_contiguous():  # zero-copy native dtype
        b, s = completion_mask.shape
        completion_mask = completion_mask.as_strided((b, s), (s, 1), completion_mask.storage_offset())
    return completion_mask != 0


def _reduce(per_token, keep, loss_type, max_completion_length, num_items_in_batch, num_processes,
            gradient_accumulation_steps=None, steps_per_generation=None):
    batch, seq = keep.shape
    m = keep.to(torch.float32)
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    if loss_type in ("grpo", "sapo"):
        return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "luspo":  # each sequence's sum (its mean scaled by its length), then the batch mean
        return per_token.sum(-1).mean()
    if loss_type == "bnpo":
        return per_token.sum() / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        length = seq if max_completion_length is None else max_completion_length
        return per_token.sum() / (batch * length)
    # dapo, cispo and vespo: the token count of the generation batch per process when it is given,
    # else this batch's token count (one process).
    if num_items_in_batch is not None and gradient_accumulation_steps is not None:
        # TRL 1.16 in training: clamp N at 1 first, then / processes, times the accumulation factor
        steps = gradient_accumulation_steps if steps_per_generation is None else steps_per_generation
        normaliser = max(1.0, float(num_items_in_batch)) / float(num_processes or 1)
        return per_token.sum() / (normaliser * gradient_accumulation_steps / steps)
    if num_items_in_batch is not None:
        normaliser = max(1.0, float(num_items_in_batch) / float(num_processes or 1))
        return per_token.sum() / normaliser
    return per_token.sum() / m.sum().clamp(min=1.0)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
              loss_type="grpo", importance_sampling_level="token", old_logprobs=None, ref_logprobs=None,
              completion_mask=None, sampling_ratio=None, beta=0.0, max_completion_length=None, delta=None,
              sampling_ratio_cap=None, num_items_in_batch=None, num_processes=1, use_bias_correction_kl=False,
              vllm_importance_sampling_mode="token_truncate", gradient_accumulation_steps=None,
              steps_per_generation=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
              vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0):
    loss_type = str(loss_type).replace("-", "_")
    if loss_type not in _NORMALISED:
        raise ValueError(f"loss_type {loss_type!r} is not implemented (expected one of {sorted(_NORMALISED)})")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")
    seq = completion_ids.shape[1]
    keep = _mask(completion_mask, completion_ids)
    m = keep.to(torch.float32)

    # log-probs of the sampled tokens; logits row `seq` is never read
    z = logits[:, :seq, :].float() / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)
    old = logp.detach() if old_logprobs is None else old_logprobs.float()
    # masked positions: the log-ratio is 0, so nothing there can overflow or reach the gradient
    log_ratio = torch.where(keep, logp - old, torch.zeros_like(logp))

    if importance_sampling_level == "sequence":  # GSPO: one ratio per sequence, from its mean log-ratio
        per_sequence = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        ratio = torch.exp(per_sequence).unsqueeze(-1).expand_as(logp)
    else:
        ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)

    if loss_type == "sapo":
        # a soft gate instead of the clip: 4/tau * sigmoid(tau (r - 1)), tau by the advantage's sign
        tau = torch.where(adv > 0, torch.full_like(adv, sapo_temperature_pos), torch.full_like(adv, sapo_temperature_neg))
        per_token = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv
    elif loss_type == "vespo":
        # a constant per-sequence gamma weight phi(w) of the sequence's ratio w (a sum of log-ratios,
        # clamped as TRL clamps it), times log-probs: the gradient flows through logp only
        with torch.no_grad():
            u = (log_ratio.clamp(-20.0, 20.0) * m).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
            nonneg = adv >= 0
            k = torch.where(nonneg, torch.full_like(adv, vespo_k_pos), torch.full_like(adv, vespo_k_neg))
            lam = torch.where(nonneg, torch.full_like(adv, vespo_lambda_pos),
                              torch.full_like(adv, vespo_lambda_neg)).clamp(min=1e-4)
            phi = torch.nan_to_num(torch.exp(lam + k * u - lam * torch.exp(u)), nan=0.0, posinf=0.0, neginf=0.0)
        per_token = -phi * adv * logp
    elif loss_type == "cispo":
        # the clipped ratio is a constant weight; the gradient flows through logp only
        weight = torch.clamp(ratio, max=epsilon_high).detach()
        per_token = -weight * adv * logp
    else:
        coef_1 = ratio if delta is None else torch.clamp(ratio, max=delta)
        coef_2 = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        unclipped, clipped = coef_1 * adv, coef_2 * adv
        per_token = -torch.where(clipped >= unclipped, unclipped, clipped)

    if sampling_ratio is not None:  # vLLM importance-sampling correction in TRL's four modes
        mode = vllm_importance_sampling_mode
        if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
            raise ValueError(f"vllm_importance_sampling_mode {mode!r} is not implemented")
        rho = sampling_ratio.float()
        if mode.startswith("sequence"):  # one ratio per sequence: exp of the kept tokens' summed log-ratios
            rho = torch.exp(torch.where(keep, torch.log(rho), torch.zeros_like(rho)).sum(-1, keepdim=True))
        if sampling_ratio_cap is not None:
            if mode.endswith("mask"):  # above the cap: the token's (or sequence's) policy term is dropped
                rho = torch.where(rho > sampling_ratio_cap, torch.zeros_like(rho), rho)
            else:
                rho = torch.clamp(rho, max=sampling_ratio_cap)
        per_token = per_token * rho

    if beta and ref_logprobs is not None:  # k3 estimator of KL(policy || reference)
        ref = torch.where(keep, ref_logprobs.float(), logp.detach())
        d = ref - logp
        kl = torch.exp(d) - d - 1.0
        if use_bias_correction_kl:  # TRL 1.16's default: times the ratio (before any clip, with its gradient)
            kl = kl * ratio
        per_token = per_token + beta * kl

    return _reduce(per_token, keep, loss_type, max_completion_length, num_items_in_batch, num_processes,
                   gradient_accumulation_steps, steps_per_generation)
