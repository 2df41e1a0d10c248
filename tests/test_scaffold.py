"""`grpo-conform init`: the starter for every member equals the float64 reference (loss and gradient);
the folder it writes is a valid implementation (the end-to-end `check` of one runs in test_packaging)."""

from __future__ import annotations

import types

import pytest
import torch

from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss
from grpo_conform.scaffold import InitError, InitRequest, run_init, starter_source
from grpo_conform.spec import find_family

MEMBERS = find_family("grpo").member_names


def _inputs(spec, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    b, s, v = 3, 6, 17
    ids = torch.randint(0, v, (b, s), generator=g)
    full = {"logits": torch.randn(b, s + 1, v, generator=g) * 2, "completion_ids": ids,
            "advantages": torch.randn(b, generator=g), "old_logprobs": torch.randn(b, s, generator=g) * 0.6 - 2.8,
            "ref_logprobs": torch.randn(b, s, generator=g) - 2.8,
            "completion_mask": torch.tensor([[1, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]),
            "sampling_ratio": torch.rand(b, s, generator=g) * 5}
    return {t.name: full[t.name] for t in spec.inputs}


@pytest.mark.parametrize("member", MEMBERS)
def test_starter_matches_the_reference(member):
    spec = find_family("grpo").member(member)
    source = starter_source(spec)
    assert "grpo_conform" not in source  # the tamper scan fails a source naming the validator
    module = types.ModuleType("starter")
    exec(compile(source, f"starter-{member}", "exec"), module.__dict__)
    for seed in (0, 1):
        x = _inputs(spec, seed)
        params = dict(spec.parameter_values)
        logits = x["logits"].clone().requires_grad_(True)
        loss = module.grpo_loss(logits, **{k: v for k, v in x.items() if k != "logits"}, **params)
        loss.backward()
        p = GrpoParameters.from_spec(spec)
        expected = reference_loss(x, p)
        got = float(loss.detach())
        assert abs(got - expected) <= 1e-5 * (1 + abs(expected)), (member, got, expected)
        torch.testing.assert_close(logits.grad.double(), reference_gradient_dense(x, p), rtol=1e-4, atol=1e-6)
    if "loss_type" in params:  # a selector the member fixes: another value is refused, not guessed
        with pytest.raises(ValueError, match="loss_type"):
            module.grpo_loss(x["logits"], **{k: v for k, v in x.items() if k != "logits"},
                             **{**params, "loss_type": "unknown"})


def test_init_writes_a_valid_folder_and_refuses_to_overwrite(tmp_path):
    from grpo_conform.gate.validate import ValidateRequest, run_validate

    result = run_init(InitRequest("dapo-mask", tmp_path / "My-Kernel"))
    assert sorted(f.name for f in result.files) == ["impl.py", "implementation.toml"]
    report = run_validate(ValidateRequest(paths=(str(tmp_path / "My-Kernel"),)))
    assert report.exit_code == 0, report.lines
    assert 'name = "my-kernel"' in (tmp_path / "My-Kernel" / "implementation.toml").read_text()
    with pytest.raises(InitError, match="already exist"):
        run_init(InitRequest("dapo-mask", tmp_path / "My-Kernel"))
    run_init(InitRequest("token-is", tmp_path / "My-Kernel", force=True))
    with pytest.raises(InitError, match="members: token-is"):
        run_init(InitRequest("no-such-member", tmp_path / "other"))


def test_init_command_writes_the_folder_and_refuses_a_second_time(tmp_path):
    from click.testing import CliRunner

    from grpo_conform.cli import main

    folder = tmp_path / "mine"
    first = CliRunner().invoke(main, ["init", "vllm-is-mask", str(folder)])
    assert first.exit_code == 0, first.output
    assert "wrote" in first.output and 'members = ["vllm-is-mask"]' in (folder / "implementation.toml").read_text()
    assert "sampling_ratio_cap" in (folder / "impl.py").read_text()
    again = CliRunner().invoke(main, ["init", "vllm-is-mask", str(folder)])
    assert again.exit_code == 2 and "already exist" in again.output and "Traceback" not in again.output
