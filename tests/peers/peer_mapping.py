"""Which trainer settings reproduce each member of the family `grpo` exactly: THE table.

docs/spec-family.md ("Every member in three trainers") cites this module; tests/peers/ runs every row
against the trainers' own loss functions (pytest -m peers), and tests/peers/test_peer_mapping.py (no extras
needed) checks that every member of specs/grpo.v1.json has a row for every trainer and that
implementations/verl claims exactly the members whose verl row is exact.

Versions read and run: TRL 1.16.0 (`GRPOTrainer._compute_loss`), Liger-Kernel 0.8.5
(`LigerFusedLinearGRPOFunction.ppo_loss_fn`, `LigerFusedLinearGRPOLoss`, `triton_grpo_loss`: one set
of flag names), verl 0.9.1 (`core_algos.get_policy_loss_fn` + `agg_loss` through the actor config).

A row is `Exact(flags)` or `NotExpressible(reason, nearest=flags, where=...)`. Flag values are
constants or names of what the call supplies:
  "=NAME"   the member's parameter NAME (as drawn);
  "@tokens" this batch's unmasked-token count (one process: TRL's and Liger's num_items_in_batch);
  "@batch"  the batch size B (verl's global_batch_size);
  "@truncated_sampling_ratio"  min(sampling_ratio, sampling_ratio_cap), formed by the caller as
            TRL's `token_truncate` mode forms it before the loss (Liger leaves it to the caller);
  "@trl_is_MODE"  TRL's weight for vllm_importance_sampling_mode MODE (token_truncate, token_mask,
            sequence_truncate, sequence_mask) with clip_max = sampling_ratio_cap (peer_runners.trl_is_ratio).
`nearest` of a NotExpressible row is the closest setting; the peers lane checks that it DOES differ
from the member where `where` says (a named draw of parameters inside the member's domain), so a
"not expressible" is tested as much as an "exact".

Adding a member (issue 33 item 1 adds several): one entry in MAPPING with a row for each trainer;
tests/peers/test_peer_mapping.py fails until every member has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

TRAINERS = ("trl", "liger", "verl")
VERSIONS = {"trl": "1.16.0", "liger": "0.8.5", "verl": "0.9.1"}


@dataclass(frozen=True)
class Exact:
    flags: Mapping[str, Any]
    # relative tolerance where the trainer itself rounds a constant to float32 on a float64 call (TRL's
    # and Liger's torch.where of two Python floats is a float32 tensor): None keeps the route's own
    float32_constants: float | None = None


@dataclass(frozen=True)
class NotExpressible:
    reason: str
    nearest: Mapping[str, Any] = field(default_factory=dict)  # empty: no setting comes close
    where: str = ""  # a named draw (tests/peers/peer_draws.py) on which `nearest` differs from the member


# verl: "vanilla" is PPO with the dual clip; clip_ratio_c above e^20 (verl clamps the log-ratio at 20)
# turns it off. verl's seq-mean modes average over non-empty sequences unless global_batch_size is set.
_NO_DUAL_CLIP = 1e9

MAPPING: dict[str, dict[str, Exact | NotExpressible]] = {
    "token-is": {
        "trl": Exact({"loss_type": "grpo"}),  # no old_per_token_logps: TRL uses the detached log-probs
        "liger": Exact({"loss_type": "grpo"}),  # old_logp=None
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP}),  # old = detached log-probs
    },
    "token-offpolicy-mask": {
        "trl": Exact({"loss_type": "grpo"}),
        "liger": Exact({"loss_type": "grpo"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP}),
    },
    "token-offpolicy-mask-kl": {
        "trl": Exact({"loss_type": "grpo", "beta": "=beta", "use_bias_correction_kl": False}),
        "liger": Exact({"loss_type": "grpo", "beta": "=beta", "use_bias_correction_kl": False}),
        "verl": NotExpressible(
            "verl's k3 (kl_penalty 'low_var_kl'/'k3') clamps ref - logp to [-20, 20] and the estimate to "
            "[-10, 10] (zero gradient beyond), and its KL loss is a separate agg_loss call"),
    },
    "bnpo-mask": {
        "trl": Exact({"loss_type": "bnpo"}),
        "liger": Exact({"loss_type": "bnpo"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_c": _NO_DUAL_CLIP}),
    },
    "dr-grpo-mask": {
        "trl": Exact({"loss_type": "dr_grpo", "max_completion_length": "=max_completion_length"}),
        "liger": Exact({"loss_type": "dr_grpo", "max_completion_length": "=max_completion_length"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-sum-norm", "global_batch_size": "@batch",
                       "loss_scale_factor": "=max_completion_length", "clip_ratio_c": _NO_DUAL_CLIP}),
    },
    "dapo-mask": {
        "trl": Exact({"loss_type": "dapo", "num_items_in_batch": "@tokens"}),  # one process, no accumulation
        "liger": Exact({"loss_type": "dapo"}),  # no num_items_in_batch, one process
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_c": _NO_DUAL_CLIP}),
    },
    "sequence-offpolicy-mask": {
        "trl": Exact({"loss_type": "grpo", "importance_sampling_level": "sequence"}),
        "liger": Exact({"loss_type": "grpo", "importance_sampling_level": "sequence"}),
        "verl": Exact({"loss_mode": "gspo", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch"}),
    },
    "token-offpolicy-mask-delta": {
        "trl": Exact({"loss_type": "grpo", "delta": "=delta"}),
        "liger": Exact({"loss_type": "grpo", "delta": "=delta"}),
        "verl": NotExpressible(
            "verl has no delta; its dual clip with clip_ratio_c = delta caps the loss for A < 0 only, which is "
            "min(r, delta) only when delta >= 1 + epsilon_high (the domain is delta > 1)",
            nearest={"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                     "clip_ratio_c": "=delta"},
            where="delta below 1 + epsilon_high"),
    },
    "cispo-mask": {
        "trl": Exact({"loss_type": "cispo", "epsilon_high": "=epsilon_high", "num_items_in_batch": "@tokens"}),
        "liger": Exact({"loss_type": "cispo", "epsilon_high": "=epsilon_high"}),
        # verl clamps r to [1 - low, 1 + high]: low = 1 and high = cap - 1 give the raw cap min(r, cap)
        "verl": Exact({"loss_mode": "cispo", "loss_agg_mode": "token-mean", "clip_ratio_low": 1.0,
                       "clip_ratio_high": "=epsilon_high-1"}),
    },
    "dapo-global-mask": {
        "trl": NotExpressible(
            "TRL divides by max(1, num_items_in_batch) / num_processes, the member by max(1, N / P): "
            "they differ when N < P, inside the domain",
            nearest={"loss_type": "dapo", "num_items_in_batch": "=num_items_in_batch",
                     "num_processes": "=num_processes"},
            where="num_items_in_batch below num_processes"),
        "liger": NotExpressible(
            "Liger takes the process count from torch.distributed, not as an argument: on one process "
            "only num_processes = 1 is reachable"),
        "verl": NotExpressible(
            "'token-mean' with batch_num_tokens = N and dp_size = P divides by N / P, not max(1, N / P)",
            nearest={"loss_mode": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_c": _NO_DUAL_CLIP,
                     "batch_num_tokens": "=num_items_in_batch", "dp_size": "=num_processes"},
            where="num_items_in_batch below num_processes"),
    },
    "vllm-is-mask": {
        # TRL forms the weight from old and sampling log-probs in _generate_and_score_completions;
        # the lane hands _compute_loss that weight (inputs["importance_sampling_ratio"]) as token_truncate forms it.
        "trl": Exact({"loss_type": "grpo", "use_vllm": True, "vllm_importance_sampling_correction": True,
                      "vllm_importance_sampling_mode": "token_truncate",
                      "vllm_importance_sampling_clip_max": "=sampling_ratio_cap",
                      "importance_sampling_ratio": "@trl_is_token_truncate"}),
        "liger": Exact({"loss_type": "grpo", "vllm_is_ratio": "@truncated_sampling_ratio"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP, "rollout_is": "token",
                       "rollout_is_threshold": "=sampling_ratio_cap"}),
    },
    # --- issue 33 item 1 (members-a): rows live once the members are in specs/grpo.v1.json ---------------
    "token-offpolicy-mask-kl-bc": {
        "trl": Exact({"loss_type": "grpo", "beta": "=beta", "use_bias_correction_kl": True}),
        "liger": Exact({"loss_type": "grpo", "beta": "=beta", "use_bias_correction_kl": True}),
        "verl": NotExpressible("verl's KL loss (kl_penalty, its own agg_loss call) has no ratio factor, and its "
                               "k3 clamps as for token-offpolicy-mask-kl"),
    },
    "vllm-token-mask": {
        "trl": Exact({"loss_type": "grpo", "use_vllm": True, "vllm_importance_sampling_mode": "token_mask",
                      "vllm_importance_sampling_clip_max": "=sampling_ratio_cap",
                      "importance_sampling_ratio": "@trl_is_token_mask"}),
        "liger": Exact({"loss_type": "grpo", "vllm_is_ratio": "@trl_is_token_mask"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP, "rollout_is": "token",
                       "rollout_is_threshold": "@verl_zero_to_cap"}),
    },
    "vllm-sequence-truncate": {
        "trl": Exact({"loss_type": "grpo", "use_vllm": True, "vllm_importance_sampling_mode": "sequence_truncate",
                      "vllm_importance_sampling_clip_max": "=sampling_ratio_cap",
                      "importance_sampling_ratio": "@trl_is_sequence_truncate"}),
        "liger": Exact({"loss_type": "grpo", "vllm_is_ratio": "@trl_is_sequence_truncate"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP, "rollout_is": "sequence",
                       "rollout_is_threshold": "=sampling_ratio_cap"}),
    },
    "vllm-sequence-mask": {
        "trl": Exact({"loss_type": "grpo", "use_vllm": True, "vllm_importance_sampling_mode": "sequence_mask",
                      "vllm_importance_sampling_clip_max": "=sampling_ratio_cap",
                      "importance_sampling_ratio": "@trl_is_sequence_mask"}),
        "liger": Exact({"loss_type": "grpo", "vllm_is_ratio": "@trl_is_sequence_mask"}),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP, "rollout_is": "sequence",
                       "rollout_is_threshold": "@verl_zero_to_cap"}),
    },
    "dapo-global-accum-mask": {
        "trl": Exact({"loss_type": "dapo", "num_items_in_batch": "=num_items_in_batch",
                      "num_processes": "=num_processes", "gradient_accumulation_steps": "=gradient_accumulation_steps",
                      "steps_per_generation": "=steps_per_generation"}),
        "liger": NotExpressible("Liger's max(1, N / world_size) clamps after the division and has no "
                                "accumulation factor"),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_c": _NO_DUAL_CLIP,
                       "dp_size": "=num_processes", "batch_num_tokens": "@accumulated_items"}),
    },
    # --- issue 33 item 1 (members-b) ---------------------------------------------------------------------
    "sapo-mask": {
        # TRL: torch.where(A > 0, tau_pos, tau_neg) is float32 (measured 6.4e-7 relative on the loss)
        "trl": Exact({"loss_type": "sapo", "sapo_temperature_pos": "=sapo_temperature_pos",
                      "sapo_temperature_neg": "=sapo_temperature_neg"}, float32_constants=1e-5),
        "liger": Exact({"loss_type": "sapo", "sapo_temperature_pos": "=sapo_temperature_pos",
                        "sapo_temperature_neg": "=sapo_temperature_neg"}),
        "verl": NotExpressible("verl's 'sapo' loss mode clamps log r to [-20, 20] (zero gradient beyond; the "
                               "far-ratios probe reaches 25) and forces 'seq-mean-token-mean'"),
    },
    "luspo-mask": {
        "trl": Exact({"loss_type": "luspo"}),
        "liger": NotExpressible("Liger reduces luspo as (per_token_loss * n_b).mean() over all B * S positions; "
                                "the member weights m / B: equal only when no token is masked"),
        "verl": Exact({"loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-sum", "global_batch_size": "@batch",
                       "clip_ratio_c": _NO_DUAL_CLIP}),
    },
    "luspo-sequence-mask": {
        "trl": Exact({"loss_type": "luspo", "importance_sampling_level": "sequence"}),
        "liger": NotExpressible("as luspo-mask: Liger's luspo weights every position by n_b / (B S)"),
        "verl": Exact({"loss_mode": "gspo", "loss_agg_mode": "seq-mean-token-sum", "global_batch_size": "@batch"}),
    },
    "vespo-mask": {
        "trl": Exact({"loss_type": "vespo", "num_items_in_batch": "@tokens", "vespo_k_pos": "=vespo_k_pos",
                      "vespo_lambda_pos": "=vespo_lambda_pos", "vespo_k_neg": "=vespo_k_neg",
                      "vespo_lambda_neg": "=vespo_lambda_neg"}, float32_constants=1e-5),
        # both: get_gamma_weights' k and lambda from torch.where of Python floats are float32 (1.8e-8 measured)
        "liger": Exact({"loss_type": "vespo", "vespo_k_pos": "=vespo_k_pos", "vespo_lambda_pos": "=vespo_lambda_pos",
                        "vespo_k_neg": "=vespo_k_neg", "vespo_lambda_neg": "=vespo_lambda_neg"},
                       float32_constants=1e-5),
        "verl": NotExpressible("verl 0.9.1 has no gamma-weight (vespo) loss mode"),
    },
}


def resolve(flags: Mapping[str, Any], values: Mapping[str, Any], supplied: Mapping[str, Any]) -> dict[str, Any]:
    """The flags with "=NAME" replaced by the member's parameter (NAME-1: minus one) and "@what" by
    `supplied[what]` (computed by the caller from the inputs)."""
    out = {}
    for key, v in flags.items():
        if isinstance(v, str) and v.startswith("="):
            name, minus_one = (v[1:-2], True) if v.endswith("-1") else (v[1:], False)
            v = values[name] - 1 if minus_one else values[name]
        elif isinstance(v, str) and v.startswith("@"):
            v = supplied[v[1:]]
        out[key] = v
    return out
