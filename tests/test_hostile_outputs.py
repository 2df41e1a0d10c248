"""Hostile outputs (2026-12-03): whatever an implementation returns is described by the worker within
the reply model's bounds, copied out only when it has dense data, and judged by the contract check, never
a protocol failure blamed on the worker or an exception in the worker's own code (no worker process here:
tests/gallery/hostile-* run the same cases end to end)."""

from __future__ import annotations

import pytest
import torch

from grpo_conform.checks.judging import gradient_contract
from grpo_conform.isolation import messages
from grpo_conform.isolation.worker import MAX_DIMS, _copyable, _describe


def _forward_reply(value) -> dict:
    _, sent = messages.parse_reply("forward", {"status": "ok", "loss": _describe(value)})
    return sent["loss"]


class _LyingShape(torch.Tensor):
    @property
    def shape(self):
        return "not a shape"


@pytest.mark.parametrize("value,field,want", [
    (torch.zeros((), dtype=torch.complex32), "dtype", "complex32"),  # a dtype the old closed list lacked
    (torch.zeros((), dtype=torch.float8_e8m0fnu), "dtype", "float8_e8m0fnu"),
    (torch.zeros([1] * 9), "shape", [1] * 9),  # more than the old 8 dimensions
    (torch.zeros([1] * (MAX_DIMS + 1)), "shape", None),
    (torch.zeros(2, 2).to_sparse(), "layout", "sparse_coo"),
    (torch.zeros((), device="meta"), "device", "meta"),
    (torch.zeros(()).as_subclass(_LyingShape), "shape", None),
    (type("X" * 5000, (), {})(), "type", None),  # a 5000-character class name: cut, not refused
])
def test_any_output_is_described_within_the_reply_model(value, field, want):
    described = _forward_reply(value)
    if field == "type":
        assert len(described["type"]) <= 200 and described["type"].endswith("...")
    else:
        assert described[field] == want


def test_a_nested_tensor_is_described_without_sizes():
    nested = torch.nested.nested_tensor([torch.zeros(1), torch.zeros(2)])
    described = _forward_reply(nested)
    assert described["layout"] == "nested" and described["shape"] is None


@pytest.mark.parametrize("name", ["Float32", "float32; rm", "x" * 41, ""])
def test_a_dtype_name_is_still_a_short_identifier(name):
    loss = {"type": "torch.Tensor", "exact_tensor": True, "dtype": name}
    with pytest.raises(messages.MalformedReply, match="malformed at loss.dtype"):
        messages.parse_reply("forward", {"status": "ok", "loss": loss})


def test_only_dense_tensors_with_data_are_copied_out():
    assert _copyable(torch.zeros(2))
    assert not _copyable(torch.zeros(2).to_sparse())
    assert not _copyable(torch.zeros(2, device="meta"))
    assert not _copyable(torch.nested.nested_tensor([torch.zeros(1)]))
    assert not _copyable(0.5)


def test_a_sparse_gradient_is_a_contract_finding():
    x = torch.zeros(3, 4, dtype=torch.bfloat16)
    sparse = {"type": "torch.Tensor", "exact_tensor": True, "dtype": "bfloat16", "shape": [3, 4], "device": "cpu",
              "layout": "sparse_coo"}
    assert gradient_contract("logits", sparse, x, "cpu", several=False) == [
        "gradient layout sparse_coo, expected strided (dense, as the logits input)"]
    assert gradient_contract("logits", dict(sparse, layout="strided"), x, "cpu", several=False) == []


def test_an_exception_with_a_long_class_name_fits_the_error_reply():
    from grpo_conform.isolation.worker import _error_info

    try:
        raise type("E" * 5000, (RuntimeError,), {})("long")
    except RuntimeError as exc:
        info = _error_info(exc, None, phase="call")
    _, sent = messages.parse_reply("forward", {"status": "error", "error": info})
    assert sent["error"]["type"].startswith("EEE") and sent["error"]["type"].endswith("...")


def test_an_expanded_loss_of_any_size_is_described_and_copied_without_materialising():
    from grpo_conform.isolation.worker import _Worker

    loss = torch.tensor([[0.25], [0.5]]).expand(2, 1 << 41)  # 2**42 elements, no memory behind them
    assert _forward_reply(loss)["shape"] == [2, 1 << 41]
    slot = {"loss": torch.empty(1, dtype=torch.float64)}
    _Worker._copy_out(None, slot, loss, {})
    assert slot["loss"].item() == 0.25


class _Impostor:
    """Passes isinstance(x, torch.Tensor): isinstance reads __class__."""
    __class__ = property(lambda self: torch.Tensor)


def test_an_object_faking_its_class_is_not_taken_for_a_tensor():
    assert isinstance(_Impostor(), torch.Tensor)  # the trick works on isinstance
    described = _forward_reply(_Impostor())
    assert described == {"type": f"{__name__}._Impostor", "exact_tensor": False}
    assert not _copyable(_Impostor())


def test_a_tensor_description_in_part_is_malformed():
    """A forged reply that fits every field's type but leaves out a tensor's device would have made the
    parent's contract check raise (exit 3, 'a tool problem'): it is refused where it enters."""
    whole = _describe(torch.zeros(()))
    for field in ("device", "shape", "layout"):
        part = {k: v for k, v in whole.items() if k != field}
        with pytest.raises(messages.MalformedReply, match="description lacks " + field):
            messages.parse_reply("forward", {"status": "ok", "loss": part})
    messages.parse_reply("forward", {"status": "ok", "loss": whole})
