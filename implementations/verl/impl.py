"""Adapter: the grpo members as verl 0.9.1 computes them, through verl's own functions (imported,
never copied): `core_algos.get_policy_loss_fn` (the registry verl's actor dispatches through:
"vanilla", "gspo", "cispo"), `core_algos.agg_loss` (called by those functions with the actor
config's `global_batch_info`), `rollout_corr_helper.compute_rollout_correction_weights` (verl's
truncated importance sampling, TIS) and `torch_functional.logprobs_from_logits`. What is ours is
the glue verl's actor does around them: logits / temperature (out of place: verl's `div_` would
write into the caller's logits), float32 log-probs (verl's FSDP actor computes them from float32
logits; its bfloat16 path would be bfloat16 arithmetic), the per-token advantages broadcast from
A[b], the config, and the dispatch table below, which is verl's documented configuration of each
loss (docs: "loss_agg_mode", "policy_loss.loss_mode"). A verl that dispatches one of these to a
different objective fails `check` for the member claimed.

How each claimed member maps (B = batch, S = completion length, N = unmasked tokens):
- token-is, token-offpolicy-mask: loss_mode "vanilla", loss_agg_mode "seq-mean-token-mean" with
  global_batch_size = B. verl's trainer sets global_batch_size to the mini-batch's number of
  sequences (ray_trainer: ppo_mini_batch_size * rollout.n), so fully masked sequences count, as
  in the spec. Left to its default (None), agg_loss would average over the *non-empty* sequences
  only: a different normaliser whenever a row is fully masked (the validator always has one).
  verl divides each sequence's token sum by n_b + 1e-8 (a relative 1e-8/n_b: far below the
  tolerances). token-is: old log-probs = the detached log-probs (ratio exactly 1).
- bnpo-mask, dapo-mask: "vanilla", "token-mean", batch_num_tokens = None (this batch's N, one
  process). Differs from the spec only on a batch with no unmasked token at all (verl: 0/0 = NaN;
  spec: max(1, N) gives 0), which no workload holds (every one has a fully unmasked row).
- dr-grpo-mask: "vanilla", "seq-mean-token-sum-norm", global_batch_size = B, loss_scale_factor =
  max_completion_length: masked sum / (B * L).
- sequence-offpolicy-mask: loss_mode "gspo" (sequence ratio with verl's stop-gradient token form,
  same value and gradient), "seq-mean-token-mean", global_batch_size = B. verl clamps the log
  sequence ratio at 10 (r <= e^10): never reached by the validator's ratios.
- cispo-mask: loss_mode "cispo", "token-mean". verl clips the weight two-sided relative to 1,
  clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high); the member's weight is min(r, epsilon_high)
  with a raw cap, so clip_ratio_low = 1 (lower bound 0: r > 0 never clipped there) and
  clip_ratio_high = epsilon_high - 1.
- vllm-is-mask: "vanilla" with rollout_is_weights from verl's TIS (rollout_is="token",
  threshold = sampling_ratio_cap) of log(sampling_ratio): min(sampling_ratio, cap), detached,
  zero on masked tokens, multiplied into the policy term before aggregation.
"vanilla" is verl's PPO loss with its dual clip (A < 0: the loss is capped at -A * clip_ratio_c,
default 3), which none of these members has: clip_ratio_c is set to 1e9, above the largest
ratio verl can form (it clamps the log-ratio at +-20: e^20 = 4.9e8), so it never acts. Ties: verl
takes torch.maximum of the negated terms (a tie splits the gradient in halves) and torch.clamp
passes it at its bounds, so a tie gets the full unclipped gradient, as the spec states.

NOT claimed:
- dapo-global-mask: verl's "token-mean" with batch_num_tokens = num_items_in_batch (N) and dp_size =
  num_processes (P) divides the masked sum by N / P; the member divides by max(1, N / P), and its
  domain (N >= 1, P >= 1) holds N < P, where the two differ. verl's N / P is TRL 1.16's dapo
  normaliser max(1, N) / P for every N >= 1, which is why grpo_loss still passes num_items_in_batch
  through: a member with TRL's normaliser (issue 33 item 1) is what it computes.
- token-offpolicy-mask-kl: verl's k3 ("low_var_kl"/"k3") clamps ref - logp to [-20, 20] and the
  estimate to [-10, 10] (zero gradient beyond); the member's k3 is unclamped. They agree only
  where exp(d) - d - 1 <= 10, so this is not the member's semantics.
- token-offpolicy-mask-delta: verl has no delta. Its dual clip with clip_ratio_c = delta acts only
  for A < 0 and caps the loss at -A * delta, where the member caps the ratio min(r, delta) for both
  signs. The two agree only when delta >= 1 + epsilon_high (then the upper clip already acts below
  delta for A > 0), and even there not at r exactly delta (torch.min splits that tie's gradient).
  The member's domain is delta > 1: with 1 < delta < 1 + epsilon_high they differ for A > 0 at
  r > delta (member -A * delta, verl -A * min(r, 1 + epsilon_high)) and for A < 0 at r > delta
  (member -A * min(r, 1 + epsilon_high), verl -A * delta), by percents of the loss
  (tests/test_verl_dual_clip.py, with verl 0.9.1's formula restated in float64). No verl
  configuration computes the member over its domain, so it is not claimed.
- sapo-mask: verl's loss_mode "sapo" (tau_pos, tau_neg) clamps the log-ratio to [-20, 20] (zero
  gradient beyond, where the member's gate still has one) and forces "seq-mean-token-mean".
- luspo-mask: verl 0.9.1 has no luspo; "vanilla" with "seq-mean-token-sum" and global_batch_size = B
  is its normaliser (docs/spec-family.md), not wired into this adapter or tested against verl yet.
- luspo-sequence-mask: the same with "gspo" (verl clamps the log sequence ratio at 10).
- vespo-mask: verl 0.9.1 has no gamma-weight loss mode.
- token-offpolicy-mask-kl-bc: verl's KL loss has no ratio factor (TRL 1.16's bias correction), and its
  k3 clamps as for token-offpolicy-mask-kl.
- vllm-token-mask: verl's rollout-correction weights express it only where the log-ratio stays
  within +-20 (its SAFETY_BOUND), with a lower threshold above 0 (tests/peers measures it); not
  claimed over the domain.
- vllm-sequence-truncate: as vllm-token-mask, for the sequence's summed log-ratio.
- vllm-sequence-mask: as vllm-token-mask, for the sequence's summed log-ratio.
- dapo-global-accum-mask: this adapter passes no gradient-accumulation factor (verl's trainer forms
  batch_num_tokens from the global token count), so TRL's max(1, N) / P * gas / spg is not reached.
"""

import math

import torch
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.config import ActorConfig

# loss_type -> (verl policy_loss.loss_mode, loss_agg_mode); sequence-level ratios use "gspo"
_MODES = {
    "grpo": ("vanilla", "seq-mean-token-mean"),
    "bnpo": ("vanilla", "token-mean"),
    "dapo": ("vanilla", "token-mean"),
    "dr_grpo": ("vanilla", "seq-mean-token-sum-norm"),
    "cispo": ("cispo", "token-mean"),
}
_NO_DUAL_CLIP = 1e9  # above e^20, verl's own bound on the ratio


def _config(loss_type, epsilon_low, epsilon_high, loss_agg_mode, loss_scale_factor):
    if loss_type == "cispo":  # the member's raw cap min(r, eps_high) in verl's relative form
        low, high = 1.0, float(epsilon_high) - 1.0
    else:
        low, high = float(epsilon_low), float(epsilon_high)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=high,
                       clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=_NO_DUAL_CLIP,
                       loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature, loss_type="grpo",
              importance_sampling_level="token", old_logprobs=None, completion_mask=None, sampling_ratio=None,
              max_completion_length=None, sampling_ratio_cap=None, num_items_in_batch=None, num_processes=1):
    loss_type = str(loss_type).replace("-", "_")
    if loss_type not in _MODES:
        raise ValueError(f"loss_type {loss_type!r}: this adapter maps {sorted(_MODES)} to verl")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")
    loss_mode, agg_mode = _MODES[loss_type]
    if importance_sampling_level == "sequence":
        if loss_type != "grpo":
            raise ValueError("sequence-level ratios are verl's 'gspo' loss, mapped here with loss_type 'grpo' only")
        loss_mode = "gspo"
    batch, seq = completion_ids.shape
    mask = torch.ones(batch, seq, dtype=torch.bool, device=logits.device) if completion_mask is None else completion_mask != 0

    z = logits[:, :seq, :].float() / temperature  # row `seq` is never read
    log_prob = logprobs_from_logits(z, completion_ids.long())
    old = log_prob.detach() if old_logprobs is None else old_logprobs.float()
    adv = advantages.float().unsqueeze(-1).expand(batch, seq)

    config = _config(loss_type, epsilon_low, epsilon_high, agg_mode,
                     max_completion_length if agg_mode == "seq-mean-token-sum-norm" else None)
    info = {"dp_size": 1, "loss_scale_factor": config.loss_scale_factor}
    if agg_mode.startswith("seq-mean"):
        info["global_batch_size"] = batch  # the mini-batch's sequences, as verl's trainer sets it
    elif num_items_in_batch is not None:
        info["batch_num_tokens"] = int(num_items_in_batch)
        info["dp_size"] = int(num_processes or 1)
    config.global_batch_info.update(info)

    weights = None
    if sampling_ratio is not None:
        cap = math.inf if sampling_ratio_cap is None else float(sampling_ratio_cap)
        weights, _ = compute_rollout_correction_weights(
            log_ratio=torch.log(sampling_ratio.float()), response_mask=mask, rollout_is="token",
            rollout_is_threshold=cap)

    policy_loss = core_algos.get_policy_loss_fn(loss_mode)
    loss, _metrics = policy_loss(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                                 loss_agg_mode=agg_mode, config=config, rollout_is_weights=weights)
    return loss
