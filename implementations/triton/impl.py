"""Entry point for spec grpo-token-is: `grpo_loss(logits, completion_ids, advantages, epsilon_low,
epsilon_high, temperature)` -> scalar float32 loss, differentiable w.r.t. logits.

Kernels live in kernels.py, launch settings in launch.py, autograd in function.py.
"""

import torch

from . import launch
from .function import GrpoLossFunction


def grpo_loss(logits, completion_ids, advantages, epsilon_low=0.2, epsilon_high=0.2, temperature=1.0):
    if logits.dim() != 3 or logits.shape[1] != completion_ids.shape[1] + 1:
        raise ValueError(f"logits must be [batch, seq + 1, vocab] for completion_ids [batch, seq]; got "
                         f"{tuple(logits.shape)} and {tuple(completion_ids.shape)}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    completion_ids = completion_ids.contiguous()
    advantages = advantages.contiguous()
    problem = launch.Problem.of(logits, epsilon_low, epsilon_high, temperature)
    settings = launch.settings_for(problem.vocab, logits.device)
    if not (torch.is_grad_enabled() and logits.requires_grad):
        # No graph will be built (inside Function.forward grad mode is always off, and
        # needs_input_grad ignores torch.no_grad): the loss alone, no gradient work.
        return launch.forward_loss(logits, completion_ids, advantages, problem, settings)
    return GrpoLossFunction.apply(logits, completion_ids, advantages, problem, settings)
