"""Liger-Kernel's GrpoLossFunction, called with inplace=False (its default is True, which writes
the gradient into the logits tensor: see implementations/liger-inplace). Needs the optional
extra: pip install 'grpo-conform[liger]'.

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
Liger asserts contiguous inputs; the adapter passes contiguous tensors (a copy only for the
strided layouts), as any trainer's call would.
"""

from liger_kernel.ops.grpo_loss import GrpoLossFunction

INPLACE = False


def _c(t):
    return None if t is None else t.contiguous()


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature,
              loss_type="grpo", importance_sampling_level="token", old_logprobs=None, ref_logprobs=None,
              completion_mask=None, sampling_ratio=None, beta=0.0, max_completion_length=None, delta=None,
              sampling_ratio_cap=None):
    loss_type = str(loss_type).replace("-", "_")
    # Positional arguments as GrpoLossFunction.forward declares them (liger-kernel 0.6-0.8.5):
    # logits, old_logp, ref_logp, completion_ids, advantages, completion_mask, temperature, beta,
    # eps_low, eps_high, inplace, loss_type, max_completion_length, reduce, importance_sampling_level
    args = [_c(logits), _c(old_logprobs), _c(ref_logprobs) if beta else None, _c(completion_ids), _c(advantages),
            _c(completion_mask), temperature, float(beta or 0.0), epsilon_low, epsilon_high, INPLACE, loss_type,
            max_completion_length, True, importance_sampling_level]
    if sampling_ratio is not None or delta is not None:
        # 0.8.x adds: sapo_temperature_pos, sapo_temperature_neg, vllm_is_ratio, delta
        rho = None
        if sampling_ratio is not None:
            rho = sampling_ratio.float()
            if sampling_ratio_cap is not None:
                rho = rho.clamp(max=sampling_ratio_cap)
            rho = rho.contiguous()
        args += [1.0, 1.05, rho, delta]
    loss, _kl, _clip_ratio = GrpoLossFunction.apply(*args)
    return loss
