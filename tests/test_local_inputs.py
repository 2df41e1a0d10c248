"""Local calls (checks/local_inputs.py): the worker's copies look like a trainer's tensors, not slot memory."""

import torch

from grpo_conform.checks.local_inputs import copied
from grpo_conform.isolation.sharing import SharedAllocator
from grpo_conform.isolation.worker import _local_copy, _write_back


def test_a_local_copy_has_none_of_the_slot_tells():
    alloc = SharedAllocator(torch.device("cpu"))
    try:
        for kind in ("contiguous", "offset", "strided"):
            slot, _ = alloc.empty_view((3, 5), torch.float32, kind)
            slot.copy_(torch.arange(15.0).view(3, 5))
            assert not slot.untyped_storage().resizable() and slot.data_ptr() % 4096 in (0, 12)
            local = _local_copy(slot)
            assert local.untyped_storage().resizable() and not local.is_shared() and local._version == 0
            assert torch.equal(local, slot) and local.stride() == slot.stride()
            assert local.storage_offset() == slot.storage_offset()
            assert local.untyped_storage().nbytes() == slot.untyped_storage().nbytes()  # the padding too
            assert (local._base is None) == (kind == "contiguous")  # a slot tensor is always a view of its mapping
            local[1, 2] = -1.0  # what the implementation writes reaches the slot
            _write_back({"x": (slot, local)})
            assert float(slot[1, 2]) == -1.0
    finally:
        alloc.close()


def test_copies_are_bounded_and_skip_what_the_leaf_mode_copies():
    t = {"logits": torch.zeros(4, 8, 64), "advantages": torch.zeros(4), "ids": torch.zeros(4, 8, dtype=torch.long)}
    assert copied(t, ["logits"], "leaf", True)[0] == ["advantages", "ids", "logits"]
    assert copied(t, ["logits"], "affine", True) == (["advantages", "ids"], [])
    assert copied(t, ["logits"], "slice", True) == (["advantages", "ids"], [])
    assert copied(t, ["logits"], "affine", False)[0] == ["advantages", "ids", "logits"]
    assert copied(t, ["logits"], "leaf", True, limit=1024) == (["advantages", "ids"], ["logits"])
