"""Operation names other sources use (Liger-Kernel's benchmark `kernel_name`s), and what each measures.

Each name maps to the spec member it measures (an operation over given logits with stated
settings), or says it is an operation we have no spec for (the fused lm_head + loss kernels take
hidden states and a weight: the logits never exist). Read from Liger-Kernel's benchmark scripts:
`benchmark/scripts/benchmark_grpo_loss_kernel.py` (GrpoLossFunction on materialized logits) and
`benchmark/scripts/benchmark_grpo_loss.py` (LigerFusedLinearGRPOLoss, the chunked fused-linear
loss), whose rows land in `benchmark/data/all_benchmark_data.csv`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

Relation = Literal["member", "unstated", "different"]
LIGER_KERNEL_SCRIPT = "Liger-Kernel benchmark/scripts/benchmark_grpo_loss_kernel.py"
LIGER_FUSED_SCRIPT = "Liger-Kernel benchmark/scripts/benchmark_grpo_loss.py"
_FUSED = ("fuses the lm_head projection into the loss: it takes hidden states [B, T, H] and the weight, and the "
          "logits never exist, so its time is not a time of an operation over given logits; its rows are judged "
          "against grpo-fused-linear (grpo_conform/audit_fused.py)")


@dataclass(frozen=True)
class KnownOperation:
    name: str
    relation: Relation  # member: a spec member defines it; unstated: GRPO over logits, settings unknown
    member: Optional[str]  # the family member it measures (relation "member")
    source: str
    note: str

    @property
    def member_id(self) -> Optional[str]:
        return f"grpo/{self.member}" if self.member else None


_KNOWN = (
    KnownOperation("grpo_loss", "unstated", None, "Liger-Kernel benchmark data (older name)",
                   "Liger-Kernel's GRPO loss over materialized logits; the record does not state its settings "
                   "(importance-sampling level, clipping, KL term): check them at the source"),
    KnownOperation("grpo_loss_kernel_no_kl", "member", "token-is", LIGER_KERNEL_SCRIPT,
                   "GrpoLossFunction on materialized logits, on-policy (no old log-probs: the ratio is exactly 1), "
                   "an all-ones completion mask, beta 0, epsilon 0.2/0.2, temperature 1: the token-is semantics. "
                   "Its `torch` provider computes the ratio without detaching the old log-probs, so its gradient "
                   "is identically zero: that provider's times are of a wrong implementation"),
    KnownOperation("grpo_loss_kernel_with_kl", "member", "token-offpolicy-mask-kl", LIGER_KERNEL_SCRIPT,
                   "GrpoLossFunction on materialized logits with the k3 KL term (beta 0.1, random reference "
                   "log-probs), on-policy (old log-probs = the log-probs: ratio exactly 1) and an all-ones mask: "
                   "the member's semantics at old_logprobs = logp, a special case that never exercises the clip"),
    KnownOperation("fused_linear_grpo_loss", "different", None, "Liger-Kernel benchmark data (older name)", _FUSED),
    KnownOperation("fused_linear_grpo_loss_token", "different", None, LIGER_FUSED_SCRIPT,
                   "token-level importance sampling (with a reference model: a KL term); " + _FUSED),
    KnownOperation("fused_linear_grpo_loss_sequence", "different", None, LIGER_FUSED_SCRIPT,
                   "sequence-level importance sampling (GSPO; with a reference model: a KL term); " + _FUSED),
)
KNOWN_OPERATIONS: dict[str, KnownOperation] = {op.name: op for op in _KNOWN}


def normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def lookup(name: str) -> Optional[KnownOperation]:
    """What a source's operation name measures, or None for a name nobody here knows."""
    return KNOWN_OPERATIONS.get(normalise(name))


def measures_member(op: KnownOperation, spec_id: str, spec_member: Optional[str]) -> bool:
    """True when `op` measures the audited spec: its member, or the frozen seed file for token-is."""
    if op.relation != "member":
        return False
    return spec_member == op.member or (spec_member is None and op.member == "token-is" and spec_id == "grpo-token-is")
