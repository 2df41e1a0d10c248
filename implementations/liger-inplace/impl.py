"""Liger-Kernel's GrpoLossFunction with its default inplace=True: backward writes d loss / d logits
into the logits tensor's storage. Bundled to show the validator catching a real kernel that
mutates its input: it must fail the no-mutation check. Needs: pip install 'grpo-conform[liger]'.

The same adapter as implementations/liger otherwise (same members, same mapping):

How the family's members map onto GrpoLossFunction (liger-kernel 0.8.5), and why this adapter
claims the members its manifest lists and no others:
- old_logprobs -> old_logp, ref_logprobs -> ref_logp (with beta), completion_mask ->
  completion_mask, loss_type grpo/bnpo/dr_grpo/dapo/cispo -> the same name,
  importance_sampling_level token/sequence -> the same, max_completion_length, delta -> the same;
- vllm-is-mask: Liger multiplies the per-token policy term by `vllm_is_ratio` before adding the
  KL term; the truncation (min(sampling_ratio, cap)) is the caller's job, as TRL does it before
  calling Liger, so this adapter truncates exactly as TRL's integration does;
- dapo-mask: Liger's dapo normaliser is the mask sum all-reduced over the torch.distributed world
  and divided by its size: on one process, this batch's token count, which is the member;
- NOT claimed, dapo-global-mask: Liger takes the process count from torch.distributed, not as an
  argument, so on one process its normaliser is num_items_in_batch / 1 whatever num_processes
  the member declares. Dividing here would test this adapter, not Liger.
- sapo-mask: `loss_type="sapo"` with `sapo_temperature_pos/neg` (GrpoLossFunction's 16th and 17th
  arguments); Liger's gate and grpo normaliser are TRL 1.16's;
- vespo-mask: through `liger_kernel.transformers.grpo_loss.triton_grpo_loss`, which computes the
  detached gamma weight phi_b itself (`chunked_loss.grpo_loss.get_gamma_weights`, TRL's formula and
  clamps) before GrpoLossFunction; normaliser dapo (one process);
- NOT claimed, luspo-mask and luspo-sequence-mask: Liger 0.8.5 reduces luspo as
  (per_token_loss * n_b).mean() over all B * S positions, i.e. weights m n_b / (B S), where TRL 1.16
  weights m / B ((per_token_loss * mask).sum(-1).mean()); equal only when no token is masked.
Liger asserts contiguous inputs; the adapter passes contiguous tensors (a copy only for the
strided layouts), as any trainer's call would.
"""

from liger_kernel.ops.grpo_loss import GrpoLossFunction

INPLACE = True


def _c(t):
    return None if t is None else t.contiguous()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
              loss_type="grpo", importance_sampling_level="token", old_logprobs=None, ref_logprobs=None,
              completion_mask=None, sampling_ratio=None, beta=0.0, max_completion_length=None, delta=None,
              sampling_ratio_cap=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
              vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0):
    loss_type = str(loss_type).replace("-", "_")
    if loss_type == "vespo":
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss

        loss, _metrics = triton_grpo_loss(
            _c(logits), _c(old_logprobs), None, _c(completion_ids), _c(advantages), _c(completion_mask),
            temperature=temperature, beta=0.0, eps_low=epsilon_low, eps_high=epsilon_high, inplace=INPLACE,
            loss_type="vespo", importance_sampling_level=importance_sampling_level, reduce=True,
            vespo_k_pos=vespo_k_pos, vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg,
            vespo_lambda_neg=vespo_lambda_neg)
        return loss
    # Positional arguments as GrpoLossFunction.forward declares them (liger-kernel 0.6-0.8.5):
    # logits, old_logp, ref_logp, completion_ids, advantages, completion_mask, temperature, beta,
    # eps_low, eps_high, inplace, loss_type, max_completion_length, reduce, importance_sampling_level
    args = [_c(logits), _c(old_logprobs), _c(ref_logprobs) if beta else None, _c(completion_ids), _c(advantages),
            _c(completion_mask), temperature, float(beta or 0.0), epsilon_low, epsilon_high, INPLACE, loss_type,
            max_completion_length, True, importance_sampling_level]
    if sampling_ratio is not None or delta is not None or loss_type == "sapo":
        # 0.8.x adds: sapo_temperature_pos, sapo_temperature_neg, vllm_is_ratio, delta
        rho = None
        if sampling_ratio is not None:
            rho = sampling_ratio.float()
            if sampling_ratio_cap is not None:
                rho = rho.clamp(max=sampling_ratio_cap)
            rho = rho.contiguous()
        args += [float(sapo_temperature_pos), float(sapo_temperature_neg), rho, delta]
    loss, _kl, _clip_ratio = GrpoLossFunction.apply(*args)
    return loss
