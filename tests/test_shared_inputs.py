"""The forty-second session's red-team probes on their own: which inputs the shared-inputs probe pairs
(ops/grpo_shared_inputs.py) and what the permuted probe rotates (checks/permuted.py). The gallery folders
kl-ref-aliases-old-reverse-k3, fused-ref-hidden-aliased-policy-head and fused-ref-logprob-cache-sum-key fail them
through the validator (tests/test_gallery.py); honest implementations pass them in every full run."""

from __future__ import annotations

import torch

from grpo_conform.ops.grpo_shared_inputs import _applies, shared_pairs
from grpo_conform.spec import find_spec


def _tensors(spec, shapes):
    return {t.name: torch.zeros(shapes[t.name], dtype=torch.float32) for t in spec.inputs if t.name in shapes}


def test_log_probs_of_one_shape_and_dtype_are_paired_and_nothing_else():
    kl = find_spec("grpo/token-offpolicy-mask-kl")
    shapes = {"old_logprobs": (2, 3), "ref_logprobs": (2, 3), "advantages": (2,), "completion_mask": (2, 3)}
    assert shared_pairs(kl, _tensors(kl, shapes)) == [("old_logprobs", "ref_logprobs")]
    assert _applies(kl) is None
    # a sampling ratio has the log-probs' shape and dtype but not their values: never passed as one
    vllm = find_spec("grpo/vllm-is-mask")
    assert shared_pairs(vllm, _tensors(vllm, {"old_logprobs": (2, 3), "sampling_ratio": (2, 3)})) == []
    assert "no two inputs" in _applies(vllm)


def test_inputs_held_in_other_dtypes_are_not_paired():
    kl = find_spec("grpo/token-offpolicy-mask-kl")
    x = {"old_logprobs": torch.zeros(2, 3), "ref_logprobs": torch.zeros(2, 3, dtype=torch.float64)}
    assert shared_pairs(kl, x) == []
