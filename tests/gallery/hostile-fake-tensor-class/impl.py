"""Hostile output: an object that claims to be a torch.Tensor through a `__class__` property, which is what
isinstance reads. The worker used to take it for a tensor and raise reading its dtype (`runs` blamed the
worker's own line); it now goes by the real type, and the contract check reports that the loss is no tensor."""
import torch


class Impostor:
    __class__ = property(lambda self: torch.Tensor)


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    return Impostor()
