"""The named steps of verify and their result type (shared by verify.py and signature.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

StepName = Literal["envelope", "signature", "schema", "semantics", "identities", "policy"]
StepStatus = Literal["pass", "fail", "skipped", "accepted-unsigned", "unverified", "accepted-unverified",
                     "not-applied"]
STEPS: tuple[StepName, ...] = ("envelope", "signature", "schema", "semantics", "identities", "policy")
OK_STATUSES = frozenset({"pass", "accepted-unsigned", "accepted-unverified", "not-applied"})


@dataclass(frozen=True)
class StepResult:
    step: StepName
    status: StepStatus
    message: str
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "status": self.status, "message": self.message, "notes": list(self.notes)}
