"""The trainers' own loss functions, called with one row of tests/peers/peer_mapping.py on one case.

Each runner returns (loss, dL/dlogits) from autograd through the trainer's function. What is ours is
only the glue a trainer does around it: logits / temperature and the log-softmax gather (TRL's model
forward and verl's actor do this before the loss; TRL 1.16 receives log-probs from the model), the
per-token advantages verl expects, and TRL's `token_truncate` weight min(sampling_ratio, cap), which
TRL forms in `_generate_and_score_completions` before `_compute_loss` (Liger leaves it to the caller).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, Mapping

import torch

from peer_mapping import resolve

# Keys of a TRL row that are entries of `inputs`, not GRPOConfig fields.
_TRL_INPUTS = ("num_items_in_batch", "importance_sampling_ratio")
# Keys of a TRL row that are the trainer's state, not GRPOConfig fields (the accelerator's process
# count, the accumulation window TRL's current_gradient_accumulation_steps holds).
_TRL_STUB = ("num_processes", "gradient_accumulation_steps")
# Keys of a verl row that go to the actor config's global_batch_info / the rollout correction.
_VERL_BATCH_INFO = ("global_batch_size", "batch_num_tokens", "dp_size", "loss_scale_factor")
_VERL_ROLLOUT = ("rollout_is", "rollout_is_threshold")


def supplied(x: Mapping[str, torch.Tensor], values: Mapping[str, Any]) -> dict[str, Any]:
    """What the "@name" flags of the table stand for, computed from this case."""
    mask = _mask(x)
    out = {"tokens": int(mask.sum()), "batch": int(mask.shape[0])}
    if "num_items_in_batch" in values and "gradient_accumulation_steps" in values:
        # verl's token-mean divides by batch_num_tokens / dp_size: TRL's accumulation factor folded into it
        out["accumulated_items"] = (float(values["num_items_in_batch"]) * float(values["gradient_accumulation_steps"])
                                    / float(values["steps_per_generation"]))
    if "sampling_ratio_cap" in values:
        # verl's IcePop form "lower_upper" zeroes weights outside [lower, upper]; lower must be > 0, and 1e-9 is
        # below e^-20, the least weight verl forms (it clamps the log-ratio at its SAFETY_BOUND 20)
        out["verl_zero_to_cap"] = f"1e-9_{values['sampling_ratio_cap']}"
    if "sampling_ratio" in x:
        out["truncated_sampling_ratio"] = x["sampling_ratio"].double().clamp(max=float(values["sampling_ratio_cap"]))
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
            out[f"trl_is_{mode}"] = trl_is_ratio(x, mask, mode, values.get("sampling_ratio_cap"))
    return out


def trl_is_ratio(x, mask, mode: str, cap) -> torch.Tensor:
    """TRL 1.16's vLLM importance weight as `_generate_and_score_completions` forms it (restated: it is
    not a function of its own there), sampling_ratio = exp(old - sampling log-probs): the masked log
    difference, summed per sequence for sequence_* modes, exp, then truncated at cap (*_truncate)
    or zeroed above it (*_mask). clip_min is None (TRL's default)."""
    diff = torch.log(x["sampling_ratio"].double()) * mask.to(torch.float64)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    cap = float("inf") if cap is None else float(cap)
    return ratio.clamp(max=cap) if mode.endswith("truncate") else ratio.masked_fill(ratio > cap, 0.0)


def _mask(x) -> torch.Tensor:
    ids = x["completion_ids"]
    if "completion_mask" in x:
        return x["completion_mask"] != 0
    return torch.ones(ids.shape, dtype=torch.bool)


def _logprobs(leaf: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    z = leaf[:, : ids.shape[1]] / temperature
    return torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _leaf(x, dtype=torch.float64) -> torch.Tensor:
    return x["logits"].detach().to(dtype).requires_grad_(True)


def _finish(loss: torch.Tensor, leaf: torch.Tensor) -> tuple[float, torch.Tensor]:
    loss.backward()
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    return float(loss.detach()), grad.double()


# --- TRL 1.16: GRPOTrainer._compute_loss on a stub holding only what it reads -------------------------

class _Accelerator:
    """One process: gather/reduce are the identity (they only feed TRL's metrics)."""

    def __init__(self, num_processes: int = 1):
        self.num_processes = num_processes
        self.sync_gradients = True

    def gather(self, t):
        return t

    gather_for_metrics = gather

    def reduce(self, t, reduction="sum"):
        return t


def trl(flags: Mapping[str, Any], x: Mapping[str, torch.Tensor], values: Mapping[str, Any]):
    from trl import GRPOConfig, GRPOTrainer

    row = resolve(flags, values, supplied(x, values))
    # TRL's own defaults (GRPOConfig's fields, not instantiated: TrainingArguments would set up a device),
    # then the member's clip, then the row. steps_per_generation None means gradient_accumulation_steps (1).
    args = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.default is not dataclasses.MISSING}
    args.update(epsilon=float(values["epsilon_low"]), epsilon_high=float(values["epsilon_high"]),
                steps_per_generation=1)
    args.update({k: v for k, v in row.items() if k not in _TRL_INPUTS and k not in _TRL_STUB})
    args = SimpleNamespace(**args)

    ids = x["completion_ids"]
    mask = _mask(x).to(torch.float64)
    leaf = _leaf(x)
    temperature = float(values["temperature"])

    def per_token_logps(model, input_ids, attention_mask, logits_to_keep, **_):
        return _logprobs(leaf, ids, temperature), torch.zeros(ids.shape, dtype=torch.float64), None

    stub = SimpleNamespace(
        args=args, model=SimpleNamespace(training=True), accelerator=_Accelerator(int(row.get("num_processes", 1))),
        loss_type=args.loss_type, epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        beta=float(args.beta), importance_sampling_level=args.importance_sampling_level,
        top_entropy_quantile=args.top_entropy_quantile, off_policy_mask_threshold=args.off_policy_mask_threshold,
        use_vllm=args.use_vllm, vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        max_completion_length=args.max_completion_length, entropy_coef=args.entropy_coef,
        use_adaptive_entropy=False, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        current_gradient_accumulation_steps=int(row.get("gradient_accumulation_steps", 1)),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        _metrics={"train": _Metrics(), "eval": _Metrics()},
        _get_per_token_logps_and_entropies=per_token_logps)
    empty = torch.zeros(ids.shape[0], 0, dtype=torch.long)
    inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids, "completion_mask": mask,
              "advantages": x["advantages"].double()}
    if "old_logprobs" in x:
        inputs["old_per_token_logps"] = x["old_logprobs"].double()
    if "ref_logprobs" in x:
        inputs["ref_per_token_logps"] = x["ref_logprobs"].double()
    if "num_items_in_batch" in row:
        inputs["num_items_in_batch"] = torch.tensor(float(row["num_items_in_batch"]), dtype=torch.float64)
    if "importance_sampling_ratio" in row:
        inputs["importance_sampling_ratio"] = row["importance_sampling_ratio"]
    return _finish(GRPOTrainer._compute_loss(stub, stub.model, inputs), leaf)


class _Metrics(dict):
    def __missing__(self, key):
        self[key] = []
        return self[key]


# --- Liger-Kernel 0.8.5 ------------------------------------------------------------------------------

def _liger_kwargs(row: Mapping[str, Any]) -> dict[str, Any]:
    kw = dict(row)
    if "epsilon_high" in kw:  # cispo's cap: Liger's name is epsilon_high here as well
        kw["epsilon_high"] = float(kw["epsilon_high"])
    return kw


def liger_torch(flags, x, values):
    """`LigerFusedLinearGRPOFunction.ppo_loss_fn`: Liger's torch loss on per-token log-probs, float64."""
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

    row = _liger_kwargs(resolve(flags, values, supplied(x, values)))
    leaf = _leaf(x)
    mask = _mask(x).to(torch.float64)
    logp = _logprobs(leaf, x["completion_ids"], float(values["temperature"]))
    kw = dict(epsilon_low=float(values["epsilon_low"]), epsilon_high=float(values["epsilon_high"]), beta=0.0)
    kw.update(row)
    loss, _metrics = LigerFusedLinearGRPOFunction.ppo_loss_fn(
        logp, mask, x["advantages"].double(), mask,
        ref_per_token_logps=x["ref_logprobs"].double() if "ref_logprobs" in x else None,
        old_per_token_logps=x["old_logprobs"].double() if "old_logprobs" in x else None, **kw)
    return _finish(loss, leaf)


def liger_fused(flags, x, values):
    """`LigerFusedLinearGRPOLoss` (float32, chunked, not compiled) with the identity as lm_head, so its
    hidden states are the logits and their gradient is dL/dlogits."""
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    row = _liger_kwargs(resolve(flags, values, supplied(x, values)))
    ids = x["completion_ids"]
    vocab = x["logits"].shape[-1]
    leaf = _leaf(x, torch.float32)
    ctor = dict(epsilon_low=float(values["epsilon_low"]), epsilon_high=float(values["epsilon_high"]), beta=0.0,
                compiled=False, temperature=float(values["temperature"]))
    ctor.update({k: v for k, v in row.items() if k != "vllm_is_ratio"})
    ctor["use_ref_model"] = bool(ctor["beta"])
    fn = LigerFusedLinearGRPOLoss(**ctor)
    hidden = leaf[:, : ids.shape[1]]
    loss, _metrics = fn(hidden, torch.eye(vocab), ids, _mask(x).to(torch.float32), x["advantages"].float(),
                        ref_per_token_logps=x["ref_logprobs"].float() if "ref_logprobs" in x else None,
                        old_per_token_logps=x["old_logprobs"].float() if "old_logprobs" in x else None,
                        vllm_is_ratio=row["vllm_is_ratio"].float() if "vllm_is_ratio" in row else None)
    return _finish(loss, leaf)


# --- verl 0.9.1 ----------------------------------------------------------------------------------------

def verl(flags, x, values):
    """`core_algos.get_policy_loss_fn(loss_mode)` (which calls `agg_loss`) with verl's ActorConfig, and
    verl's token TIS weights where the row asks for them. float64 log-probs (verl's actor: float32)."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.workers.config import ActorConfig

    row = resolve(flags, values, supplied(x, values))
    ids = x["completion_ids"]
    mask = _mask(x)
    leaf = _leaf(x)
    logp = _logprobs(leaf, ids, float(values["temperature"]))
    old = x["old_logprobs"].double() if "old_logprobs" in x else logp.detach()
    adv = x["advantages"].double().unsqueeze(-1).expand_as(logp)
    low = float(row.get("clip_ratio_low", values["epsilon_low"]))
    high = float(row.get("clip_ratio_high", values["epsilon_high"]))
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=high,
                         clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=float(row.get("clip_ratio_c", 3.0)),
                         loss_agg_mode=row["loss_agg_mode"], loss_scale_factor=row.get("loss_scale_factor"))
    info = {"dp_size": 1, "loss_scale_factor": config.loss_scale_factor}
    info.update({k: row[k] for k in _VERL_BATCH_INFO if k in row})
    config.global_batch_info.update(info)
    weights = None
    if "rollout_is" in row:
        weights, _ = compute_rollout_correction_weights(
            log_ratio=torch.log(x["sampling_ratio"].double()), response_mask=mask, rollout_is=row["rollout_is"],
            rollout_is_threshold=row["rollout_is_threshold"] if isinstance(row["rollout_is_threshold"], str)
            else float(row["rollout_is_threshold"]))
    loss_fn = core_algos.get_policy_loss_fn(row["loss_mode"])
    loss, _ = loss_fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                      loss_agg_mode=row["loss_agg_mode"], config=config, rollout_is_weights=weights)
    return _finish(loss, leaf)


RUNNERS = {"trl": trl, "liger-torch": liger_torch, "liger-fused": liger_fused, "verl": verl}
TRAINER_OF = {"trl": "trl", "liger-torch": "liger", "liger-fused": "liger", "verl": "verl"}
