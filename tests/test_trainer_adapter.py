"""The trainer adapter (issue 18 item 2): implementations/verl wraps verl's own loss functions
(imported, never copied). Where verl is installed, `check` runs it on one small CPU workload of
every member it claims, and an adapter whose dispatch sends CISPO to verl's PPO loss (a trainer
dispatching to the wrong objective) fails the member it claims. Where verl is not installed (CI:
it is in no extra CI installs) the adapter is SKIPPED, never failed: that part runs everywhere.

Install here (light, no ray[default]/wandb/datasets; never another torch): docs/spec-family.md,
"Trainer cross-check and trainer adapter". That section also records a known flake of the
validator, not of the adapter: mask-fp32's adversarial-inputs fails on about 0.5-1% of draws of an
off-policy member (~3% for cispo-mask), implementations/pytorch alike on the same seeds."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest

from conftest import ROOT
from grpo_conform.check import CheckRequest, run_check
from member_cases import member_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ADAPTER = ROOT / "implementations" / "verl"
MANIFEST = tomllib.loads((ADAPTER / "implementation.toml").read_text())
CLAIMED = list(MANIFEST["members"])
# verl's clamped k3; no delta (its dual clip is another clip); N / P where the member has max(1, N / P)
NOT_CLAIMED = {"token-offpolicy-mask-kl", "token-offpolicy-mask-delta", "dapo-global-mask",
               "sapo-mask", "luspo-mask", "luspo-sequence-mask", "vespo-mask",  # sapo: verl clamps log r at 20
               "token-offpolicy-mask-kl-bc", "vllm-token-mask", "vllm-sequence-truncate", "vllm-sequence-mask",
               "dapo-global-accum-mask"}


def _workload(member: str) -> str:
    return "odd-vocab" if member == "token-is" else "mask-fp32"


def _copy(tmp_path, name: str):
    folder = tmp_path / name
    shutil.copytree(ADAPTER, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_manifest_claims_members_of_the_family_and_says_why_not_the_others():
    assert MANIFEST["spec"] == "grpo" and "verl" in MANIFEST["requires"]
    family = set(member_names())
    assert set(CLAIMED) <= family and len(CLAIMED) == len(set(CLAIMED))
    assert set(CLAIMED) == family - NOT_CLAIMED
    text = (ADAPTER / "impl.py").read_text()
    for member in NOT_CLAIMED:
        assert f"- {member}:" in text  # the reason it is not claimed is written down


@pytest.mark.slow  # where verl is absent (CI): implementations/pytorch checked twice (-k forward-only) beside it
def test_a_missing_trainer_skips_the_adapter(tmp_path):
    folder = _copy(tmp_path, "verl")
    manifest = (folder / "implementation.toml").read_text()
    (folder / "implementation.toml").write_text(manifest.replace('requires = ["verl",', 'requires = ["verl_absent_here",'))
    folders = [folder]
    if importlib.util.find_spec("verl") is None:  # CI: the real folder too
        folders.append(ADAPTER)
    for f in folders:
        # beside another implementation, as `grpo-conform check implementations/` runs it: the run passes
        # (-k forward-only: pytorch's own conformance is not the point here, and is checked elsewhere)
        report = run_check(CheckRequest((str(f), str(ROOT / "implementations" / "pytorch")), device="cpu",
                                        workloads=("mask-fp32",), members=("bnpo-mask",), checks=("forward-only",)))
        skipped, pytorch = report.implementations
        assert skipped.status == "skipped" and "not installed" in skipped.message, skipped.message
        assert pytorch.status == "conformant", pytorch.message
        assert report.exit_code == 0  # skipped is not failed (only --strict makes it one)
        strict = run_check(CheckRequest((str(f),), device="cpu", workloads=("mask-fp32",), strict=True))
        assert strict.exit_code != 0 and strict.implementations[0].status == "skipped"


def _need_verl():
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (optional extra `verl`)")


@pytest.mark.slow
@pytest.mark.parametrize("member", CLAIMED)
def test_verl_conforms_to_every_member_it_claims(member):
    _need_verl()
    from grpo_conform.testing import assert_conforms

    assert_conforms(str(ADAPTER), device="cpu", workloads=[_workload(member)], members=[member])


@pytest.mark.slow
def test_a_trainer_dispatching_cispo_to_its_ppo_loss_fails_the_member(tmp_path):
    _need_verl()
    folder = _copy(tmp_path, "verl-misdispatch")
    impl = (folder / "impl.py").read_text()
    wrong = impl.replace('"cispo": ("cispo", "token-mean")', '"cispo": ("vanilla", "token-mean")')
    assert wrong != impl
    (folder / "impl.py").write_text(wrong)
    manifest = (folder / "implementation.toml").read_text()
    start, end = manifest.index("members = ["), manifest.index("]", manifest.index("members = [")) + 1
    (folder / "implementation.toml").write_text(manifest[:start] + 'members = ["cispo-mask"]' + manifest[end:])
    report = run_check(CheckRequest((str(folder),), device="cpu", workloads=("mask-fp32",)))
    (result,) = report.implementations
    assert report.exit_code == 1 and result.status == "failed", result.message
    outcomes = {o.check: o for w in result.workloads for o in w.outcomes}
    assert outcomes["loss"].failed and outcomes["gradient"].failed
