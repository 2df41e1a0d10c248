"""What each operation requires of a spec's inputs, for the loader's cross-checks (issue 31).

The spec package cannot import `grpo_conform.ops` (ops imports the spec package), so the requirement
is data here and each operation object points at its own entry (`Operation.requirements`;
tests/test_fused_spec.py checks that every registered operation has one). A spec naming an operation
this table does not know is checked as grpo-logits: `grpo_conform.ops.operation_for` refuses the
unknown name when the spec is run, with the known names, so loading it (`spec show`) still works.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperationInputs:
    """`differentiable`: inputs every member declares, differentiable, each with a gradient and a
    `grad:NAME` write in every protocol that runs a backward; `optional_differentiable`: the same when
    present (a bias); `required`: further inputs every member declares; `kl_sources`: the inputs a KL
    term takes its reference log-probs from (one of them, at least); `exactly_one_differentiable`: the
    format-1 rule kept word for word for grpo-logits (its error texts are tested)."""

    differentiable: tuple[str, ...]
    optional_differentiable: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    kl_sources: tuple[str, ...] = ("ref_logprobs",)
    exactly_one_differentiable: bool = False


OPERATION_INPUTS: dict[str, OperationInputs] = {
    "grpo-logits": OperationInputs(("logits",), required=("completion_ids", "advantages"),
                                   exactly_one_differentiable=True),
    "grpo-fused-linear": OperationInputs(("hidden", "weight"), ("bias",), required=("completion_ids", "advantages"),
                                         kl_sources=("ref_logprobs", "ref_weight")),
}


def requirements_for(operation: str | None) -> OperationInputs:
    return OPERATION_INPUTS.get(operation or "grpo-logits", OPERATION_INPUTS["grpo-logits"])
