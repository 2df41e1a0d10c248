"""`grpo-conform check --spec ID --member NAME` works as `--spec FILE` does (issue 31: only the file path
worked; an id was read as a path and failed with 'file not found')."""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT
from grpo_conform.check import CheckRequest
from grpo_conform.gate.plan import build_plan
from grpo_conform.spec import SpecError
from grpo_conform.spec.find import known_spec_ids, resolve_spec_option

FUSED_TORCH = str(ROOT / "implementations" / "fused-torch")
FUSED_FILE = str(ROOT / "specs" / "grpo-fused-linear.v1.json")
CPU = torch.device("cpu")


def _planned(spec: str, members: tuple[str, ...] = ("token-is",)) -> list[tuple[str, str, tuple[str, ...]]]:
    plan = build_plan(CheckRequest((FUSED_TORCH,), device="cpu", spec_path=spec, members=members), CPU)
    return [(m.spec.id, m.spec.identity, tuple(w.name for w in m.workloads))
            for p in plan.implementations for m in p.members]


@pytest.mark.parametrize("ref", ["grpo-fused-linear", "grpo-fused-linear@1.0.0", "grpo-fused-linear/token-is"])
def test_a_spec_id_plans_what_the_file_plans(ref):
    by_file = _planned(FUSED_FILE)
    assert [m[0] for m in by_file] == ["grpo-fused-linear/token-is"] and by_file[0][2]  # CPU workloads planned
    assert _planned(ref) == by_file  # same member, identity and workloads


def test_a_family_id_without_member_plans_the_manifests_members():
    by_id, by_file = _planned("grpo-fused-linear", ()), _planned(FUSED_FILE, ())
    assert by_id == by_file and len(by_id) > 1


def test_resolution_keeps_files_and_names_the_known_ids_for_an_unknown_one():
    assert resolve_spec_option(FUSED_FILE) == FUSED_FILE
    assert resolve_spec_option("missing.json") == "missing.json"  # a missing file keeps its own error
    assert resolve_spec_option("grpo-fused-linear").endswith("grpo-fused-linear.v1.json")
    assert resolve_spec_option("grpo-fused-linear/token-is").id == "grpo-fused-linear/token-is"
    assert {"grpo", "grpo-fused-linear", "grpo-fused-linear/token-is", "grpo-token-is"} <= set(known_spec_ids())
    with pytest.raises(SpecError, match="known ids: .*grpo-fused-linear/token-is"):
        resolve_spec_option("grpo-fused-lineer")


def test_the_cli_says_which_ids_exist():
    from click.testing import CliRunner

    from grpo_conform.cli import main

    run = CliRunner().invoke(main, ["check", FUSED_TORCH, "--device", "cpu", "--no-evidence", "--spec",
                                    "grpo-fused-lineer", "--member", "token-is"])
    assert run.exit_code != 0 and "Traceback" not in run.output
    assert "'grpo-fused-lineer' is neither a file nor a known spec id" in run.output
    assert "grpo-fused-linear/token-is" in run.output
