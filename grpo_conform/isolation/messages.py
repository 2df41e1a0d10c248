"""Strict models of every message a worker sends, checked in the parent before anything reads it.

The worker runs the code under test, so each reply is treated as hostile input: types are exact
(strict mode: no "1" for 1, no true for 1), unknown fields are refused, numbers have ranges and
strings and lists lengths. A reply that does not fit is a protocol failure (the session kills the
worker and the `runs` check fails with the reason), never a traceback in the validator or a
misleading verdict built on a forged value.

Adding a reply for a new worker op is one small class and one line in `REPLIES`:

    class FooReply(Ok):
        things: Annotated[list[Count], Field(max_length=64)]

    REPLIES["foo"] = FooReply

and, beside it, the handler in worker.OPS and a row in docs/architecture.md's "Worker protocol"
table (tests/test_worker_protocol.py holds the three and the parent's sends together).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grpo_conform.errors import GrpoConformError

Count = Annotated[int, Field(ge=0, le=1 << 62)]
Address = Annotated[int, Field(ge=0, lt=1 << 64)]
Nanoseconds = Annotated[int, Field(ge=0, le=10**13)]  # under three hours
ShortText = Annotated[str, Field(max_length=300)]
LongText = Annotated[str, Field(max_length=4000)]
Dim = Annotated[int, Field(ge=0, le=1 << 62)]  # an expanded (stride-0) tensor has any size at no cost
# A dtype, device or layout as torch names it: any short identifier, not a closed list, so that an
# output of a dtype this list did not foresee (complex32, float8_e8m0fnu, ...) reaches the contract
# check as a finding about the implementation instead of breaking the message protocol.
TorchName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Ok(_Strict):
    status: Literal["ok"]


class ErrorInfo(_Strict):
    type: ShortText
    message: LongText
    where: LongText = ""
    phase: ShortText = "call"
    traceback: LongText = ""  # the last frames of the implementation's exception (REPORT, issue 16)


class ErrorReply(_Strict):
    status: Literal["error"]
    error: ErrorInfo
    field: Optional[Literal["entry"]] = None
    fatal: bool = False


class LoadInfo(_Strict):
    torch: ShortText
    pid: Annotated[int, Field(ge=1, le=1 << 22)]
    gpu: Optional[ShortText] = None


class LoadReply(Ok):
    info: LoadInfo


class Described(_Strict):
    """What the worker says about an output (only the worker can see its Python object)."""

    type: ShortText
    exact_tensor: bool
    dtype: Optional[TorchName] = None
    shape: Optional[Annotated[list[Dim], Field(max_length=64)]] = None  # None: nested, or over 64 dimensions
    device: Optional[TorchName] = None
    layout: Optional[TorchName] = None  # "strided", "sparse_coo", ..., or "nested"
    requires_grad: Optional[bool] = None
    has_grad_fn: Optional[bool] = None

    @model_validator(mode="after")
    def _whole(self) -> "Described":
        """A tensor is described whole (the worker's _describe sends every field; shape may be None) and
        anything else by type alone: the parent's judging reads each field of a tensor's description."""
        tensor = set(TENSOR_FIELDS)
        given = self.model_fields_set & tensor
        if given and given != tensor:
            raise ValueError(f"a tensor's description lacks {', '.join(sorted(tensor - given))}")
        return self


TENSOR_FIELDS = ("dtype", "shape", "device", "layout", "requires_grad", "has_grad_fn")


StorageRange = Annotated[list[Address], Field(min_length=2, max_length=2)]


class ForwardReply(Ok):
    loss: Optional[Described]


class ExportReport(_Strict):
    loss: Optional[Described]
    grads: Annotated[dict[ShortText, Optional[Described]], Field(max_length=16)]  # by differentiable input
    storage: Annotated[dict[ShortText, Optional[StorageRange]], Field(max_length=64)]  # inputs, loss, "grad:<name>"


class BackwardReply(Ok):
    skipped: Annotated[dict[ShortText, LongText], Field(max_length=64)] = {}
    report: Optional[ExportReport] = None  # with `export`: that call's export report


class Effect(_Strict):
    call: ShortText
    state: ShortText
    before: ShortText
    after: ShortText


class EffectsReply(Ok):
    effects: Annotated[list[Effect], Field(max_length=16)]  # global_state.MAX_EFFECTS


Count = Annotated[int, Field(ge=0, le=1 << 60)]


class ResourcesReply(Ok):
    file_descriptors: Optional[Count]  # isolation/resources.py; None where not measurable
    threads: Optional[Count]
    tensors: Optional[Count]
    cuda_bytes: Optional[Count]
    frozen_objects: Optional[Count]  # gc.get_freeze_count()


class MemoryPeakReply(Ok):
    reserved_peak: Optional[Count]  # torch.cuda.max_memory_reserved() since the last ask; None without CUDA


class ExportReply(Ok):
    report: ExportReport


class TimedCall(_Strict):
    event_ns: Nanoseconds
    wall_ns: Nanoseconds
    pre_ns: Nanoseconds
    enqueue_ns: Nanoseconds
    peak_bytes: Annotated[int, Field(ge=-(1 << 50), le=1 << 50)]


class TimeReply(Ok):
    results: Annotated[list[TimedCall], Field(max_length=100_000)]


class PrecompileReply(Ok):
    failed: Annotated[list[LongText], Field(max_length=256)] = []  # "<slot>: <exception type>"
    side_by_side: bool = False  # compiled on threads, not run (isolation/compile_only.py)


class UnbindReply(Ok):
    held: Annotated[list[ShortText], Field(max_length=256)] = []  # "<slot>.<input>" storages still alive


#: The reply each worker op must get (docs/architecture.md, "Worker protocol").
REPLIES: dict[str, type[_Strict]] = {
    "warm": Ok,
    "load": LoadReply,
    "bind": Ok,
    "unbind": UnbindReply,
    "forward": ForwardReply,
    "backward": BackwardReply,
    "export": ExportReply,
    "rewrite": Ok,
    "precompile": PrecompileReply,
    "reexport": Ok,
    "effects": EffectsReply,
    "resources": ResourcesReply,
    "memory_peak": MemoryPeakReply,
    "drop": Ok,
    "time_setup": Ok,
    "time": TimeReply,
}


class MalformedReply(GrpoConformError):
    """A worker reply that does not fit its model: the reason names the field."""


def parse_reply(op: str, msg: Any) -> tuple[Union[_Strict, ErrorReply], dict[str, Any]]:
    """(model, dict as sent) of a reply to `op`; raises MalformedReply with the first problem."""
    if not isinstance(msg, dict):
        raise MalformedReply(f"the reply to {op!r} is a JSON {type(msg).__name__}, not an object")
    model = ErrorReply if msg.get("status") == "error" else REPLIES.get(op)
    if model is None:
        raise MalformedReply(f"no reply model for worker op {op!r}: add one to grpo_conform/isolation/messages.py "
                             "(REPLIES)")
    try:
        parsed = model.model_validate(msg)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(message)"
        raise MalformedReply(f"the reply to {op!r} is malformed at {where}: {err['msg']}") from None
    return parsed, parsed.model_dump(exclude_unset=True)
