"""Adapter: the spec's call convention to Liger-Kernel 0.8.5's `LigerFusedLinearGRPOLoss` (the
operation the seed record timed, issue 31).

Flag mapping (spec -> Liger):
  hidden -> _input, weight -> lin_weight, bias -> bias, completion_ids -> selected_token_ids,
  completion_mask -> attention_mask (ones when the member has none; as float32, whatever its dtype),
  advantages -> advantages, old_logprobs -> old_per_token_logps (absent: Liger detaches the log-probs,
  ratio exactly 1), ref_logprobs -> ref_per_token_logps, ref_hidden / ref_weight -> ref_input /
  ref_weight (ref_input = hidden when ref_hidden is absent);
  epsilon_low, epsilon_high, temperature, loss_type, importance_sampling_level, max_completion_length
  (dr_grpo) -> the same names; beta -> beta with use_ref_model=True on the KL members, beta=0 and
  use_ref_model=False otherwise; use_bias_correction_kl=False (the fused members' KL is TRL's k3
  without it); num_items_in_batch=None, so dapo normalises by this batch's token count (one process,
  the dapo-mask member). compiled=False: torch.compile of Liger's chunk function is what `compiled`
  switches, and the validator checks the computation, not the compiler (Liger's default is True).
  chunk_size=1 (Liger's default).

Liger computes every gradient inside its forward and its backward only scales them by the upstream
gradient: what the seed benchmark's "backward" mode timed (docs/operations.md).
"""

import torch
from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss


def fused_grpo_loss(hidden, weight, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
                    bias=None, old_logprobs=None, ref_logprobs=None, completion_mask=None, ref_weight=None,
                    ref_hidden=None, beta=0.0, loss_type="grpo", importance_sampling_level="token",
                    max_completion_length=None):
    kl = ref_logprobs is not None or ref_weight is not None
    loss_fn = LigerFusedLinearGRPOLoss(
        beta=beta if kl else 0.0, compiled=False, use_ref_model=kl, chunk_size=1, epsilon_low=epsilon_low,
        epsilon_high=epsilon_high, loss_type=loss_type, max_completion_length=max_completion_length,
        importance_sampling_level=importance_sampling_level, temperature=temperature,
        use_bias_correction_kl=False)
    mask = (torch.ones(completion_ids.shape, device=completion_ids.device) if completion_mask is None
            else (completion_mask != 0).to(torch.float32))
    if ref_weight is not None and ref_hidden is None:
        ref_hidden = hidden.detach()
    out = loss_fn(hidden, weight, completion_ids, mask, advantages, bias=bias, ref_per_token_logps=ref_logprobs,
                  old_per_token_logps=old_logprobs, ref_input=ref_hidden, ref_weight=ref_weight)
    return out[0] if isinstance(out, tuple) else out
