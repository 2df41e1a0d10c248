"""`assert_conforms(folder, workloads=[...])` checks every member the manifest declares (issue 28
point 4): the review's case, `workloads=["odd-vocab"]` on a folder declaring masked members, passed an
implementation that ignores the mask, having dropped those members."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT
from grpo_conform.check import CheckRequest
from grpo_conform.gate.plan import SelectionError, build_plan
from grpo_conform.testing import assert_conforms, members_to_check

MASK_IGNORED = "    return torch.ones_like(completion_ids, dtype=torch.bool)  # ignores the mask\n"


@pytest.fixture
def ignores_mask(tmp_path):
    """The pytorch baseline declaring token-is and one masked member, with `_mask` ignoring the mask:
    right on token-is, wrong on every masked member."""
    folder = tmp_path / "ignores-mask"
    shutil.copytree(ROOT / "implementations" / "pytorch", folder, ignore=shutil.ignore_patterns("__pycache__"))
    toml = (folder / "implementation.toml").read_text()
    start = toml.index("members = [")
    end = toml.index("]", start) + 1
    (folder / "implementation.toml").write_text(toml[:start] + 'members = ["token-is", "token-offpolicy-mask"]'
                                                 + toml[end:])
    src = (folder / "impl.py").read_text()
    head, body = src.split("def _mask(completion_mask, completion_ids):\n", 1)
    (folder / "impl.py").write_text(head + "def _mask(completion_mask, completion_ids):\n" + MASK_IGNORED
                                    + "\n\n" + body[body.index("def _reduce"):])
    return folder


def test_a_member_no_named_workload_applies_to_is_refused_not_dropped(ignores_mask):
    with pytest.raises(SelectionError, match="token-offpolicy-mask of pytorch, so they would go unchecked") as e:
        assert_conforms(ignores_mask, device="cpu", workloads=["odd-vocab"])
    assert "'mask-small-bf16'" in str(e.value) and "members=[...]" in str(e.value)  # what to do instead


def test_a_named_workload_that_applies_to_no_declared_member_is_refused(ignores_mask):
    with pytest.raises(SelectionError, match="'mask-b8-typo' applies to no member pytorch declares"):
        assert_conforms(ignores_mask, device="cpu", workloads=["odd-vocab", "mask-small-bf16", "mask-b8-typo"])


def test_members_to_check_is_every_declared_member_unless_narrowed_on_purpose(ignores_mask):
    both = ("token-is", "token-offpolicy-mask")
    assert members_to_check(ignores_mask, None, ()) == both
    assert members_to_check(ignores_mask, None, ("odd-vocab", "mask-small-bf16")) == both
    assert members_to_check(ignores_mask, None, ("odd-vocab",), ("token-is",)) == ("token-is",)


def test_a_pass_on_fewer_members_than_declared_is_an_assertion_error(ignores_mask, monkeypatch):
    """The run is planned on every member; a report that comes back conformant on fewer (how the old
    behaviour looked) fails the assertion instead of passing. No worker runs: `check` is replaced."""
    import grpo_conform.check

    planned = []

    def fake_check(path, device, workloads, members, spec, timing, timeout):
        plan = build_plan(CheckRequest((path,), device=device, workloads=tuple(workloads), members=tuple(members)),
                          torch.device("cpu"))
        planned.extend((m.label, tuple(w.name for w in m.workloads)) for p in plan.implementations for m in p.members)
        only = SimpleNamespace(member="token-is")
        impl = SimpleNamespace(name="pytorch", status="conformant", message="", members=(only,), workloads=())
        return SimpleNamespace(implementations=(impl,))

    monkeypatch.setattr(grpo_conform.check, "check_paths", fake_check)
    with pytest.raises(AssertionError, match=r"checked 1 of the 2 members .*not checked: token-offpolicy-mask"):
        assert_conforms(ignores_mask, device="cpu", workloads=["odd-vocab", "mask-small-bf16"])
    assert planned == [("token-is", ("odd-vocab",)), ("token-offpolicy-mask", ("mask-small-bf16",))]
