"""Unit level, before (and beside) the end-to-end gallery run: every member gallery folder's function,
called directly on the CPU, disagrees with the float64 reference on the member it cheats on, in the
checks its expect.toml names; the issue-19 floor folders compute the right loss and gradient."""

from __future__ import annotations

import sys

import pytest

from conftest import GALLERY
from member_cases import compare, load_impl, member_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MEMBER_FOLDERS = sorted(p for p in GALLERY.iterdir() if (p / "expect.toml").is_file()
                        and "member" in tomllib.loads((p / "expect.toml").read_text()))
CHECK_OF = {"loss": "loss_ok", "gradient": "gradient_ok"}


def test_the_member_classes_have_folders():
    names = {p.name for p in MEMBER_FOLDERS}
    assert {"clip-ignored", "mask-ignored", "bnpo-as-grpo", "kl-k1", "kl-beta-ignored",
            "sequence-ratio-per-token"} <= names


@pytest.mark.parametrize("folder", MEMBER_FOLDERS, ids=[p.name for p in MEMBER_FOLDERS])
def test_member_folder_fails_its_member(folder):
    expect = tomllib.loads((folder / "expect.toml").read_text())
    manifest = tomllib.loads((folder / "implementation.toml").read_text())
    assert manifest["spec"] == "grpo" and manifest["members"] == [expect["member"]]
    spec = member_spec(expect["member"])
    fn = load_impl(folder)
    for seed in (0, 1):
        result = compare(fn, spec, seed)
        for check in expect["fails"]:
            if check in CHECK_OF:  # the direct comparison judges loss and gradient; the rest needs check
                assert not getattr(result, CHECK_OF[check]), f"{folder.name} should fail {check}: {result}"


@pytest.mark.parametrize("folder", MEMBER_FOLDERS, ids=[p.name for p in MEMBER_FOLDERS])
def test_the_cheat_is_invisible_where_the_member_does_not_differ(folder):
    # what makes each class a trap: on the seed semantics (on-policy, no mask, no KL) the cheat is exact
    name = tomllib.loads((folder / "expect.toml").read_text())["member"]
    if name == "token-offpolicy-mask-kl":
        pytest.skip("a KL term always differs from the seed semantics (which has none)")
    if name == "cispo-mask":
        pytest.skip("CISPO's -c*A*logp differs from GRPO's surrogate even at ratio 1")
    spec = member_spec(name)
    fn = load_impl(folder)

    import torch

    from member_cases import B, S, make_inputs, member_parameters

    x = make_inputs(spec, 0, member_parameters(spec))
    x["completion_mask"] = torch.ones(B, S, dtype=torch.bool)
    if "sampling_ratio" in x:  # sampler and trainer agree: the vLLM correction is 1
        x["sampling_ratio"] = torch.ones(B, S)
    values = member_parameters(spec)
    if "num_items_in_batch" in values:  # the global normaliser equals this micro-batch's token count
        values["num_items_in_batch"] = B * S * values["num_processes"]
    if "steps_per_generation" in values:  # TRL's default steps_per_generation = gradient_accumulation_steps
        values["steps_per_generation"] = values["gradient_accumulation_steps"]
    leaf = x["logits"].clone().requires_grad_()
    # old = logp.detach(): the ratio is exactly 1
    z = torch.log_softmax(leaf[:, :S].float() / member_parameters(spec)["temperature"], -1)
    x["old_logprobs"] = z.gather(-1, x["completion_ids"].unsqueeze(-1)).squeeze(-1).detach()
    honest = load_impl(GALLERY.parent.parent / "implementations" / "pytorch")
    a = fn(**{**x, "logits": leaf}, **values)
    b = honest(**{**x, "logits": leaf}, **values)
    # equal lengths and ratio 1: no clip acts, no mask, grpo and bnpo agree, token and sequence ratios agree
    assert float(a.detach()) == pytest.approx(float(b.detach()), rel=1e-5, abs=1e-7)


def test_forward_skipping_the_logits_is_correct():
    spec = member_spec("token-is")
    result = compare(load_impl(GALLERY / "forward-skips-logits"), spec)
    assert result.loss_ok and result.gradient_ok, result


def test_full_skipping_the_gradient_is_correct_until_timed():
    fn = load_impl(GALLERY / "full-skips-gradient")
    spec = member_spec("token-is")
    assert compare(fn, spec).gradient_ok  # the first calls (the conformance checks) are right


def test_ties_handed_to_the_clipped_branch_lose_the_whole_gradient_only_at_ties():
    """tie-other-way, called directly: right on drawn ratios (kept away from the bounds), zero
    gradient on the validator's exact-tie inputs where the reference keeps the full one."""
    import random

    import torch

    from grpo_conform.ops.grpo_logits.inputs import generate
    from grpo_conform.ops.grpo_logits.member_inputs import exact_tie_inputs
    from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense
    from grpo_conform.spec import draw_parameters

    fn = load_impl(GALLERY / "tie-other-way")
    spec = member_spec("token-offpolicy-mask")
    assert compare(fn, spec, 0).gradient_ok
    rw = spec.resolve(spec.workload("mask-fp32"), random.Random(3))
    values = draw_parameters(spec, random.Random(3))
    x, tie_values = exact_tie_inputs(spec, generate(spec, rw, 3, "cpu", values=values).tensors, values, 3)
    leaf = x["logits"].clone().requires_grad_()
    fn(**{**x, "logits": leaf}, **tie_values).backward()
    ref = reference_gradient_dense(x, GrpoParameters.from_spec(spec, tie_values))
    assert float(ref.abs().max()) > 1e-3 and float(leaf.grad.abs().max()) == 0.0
