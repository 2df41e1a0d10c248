"""The bundled implementations against the float64 reference, member by member, called directly on
small CPU shapes (the end-to-end `check` of each member is the LEAD's conformance run). Liger runs
in a subprocess: TRITON_INTERPRET=1 must be set before triton is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from member_cases import compare, load_impl, member_names, member_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

IMPLEMENTATIONS = ROOT / "implementations"


def _declared(name: str) -> list[str]:
    manifest = tomllib.loads((IMPLEMENTATIONS / name / "implementation.toml").read_text())
    assert manifest["spec"] == "grpo"
    return list(manifest["members"])


def test_manifests_declare_members_of_the_family():
    family = set(member_names())
    assert _declared("pytorch") == member_names()  # the baseline: every member
    assert _declared("torch-compile") == member_names()
    for name in ("liger", "liger-inplace"):
        declared = _declared(name)
        assert set(declared) <= family and len(declared) == len(set(declared))
        # Liger takes the process count from torch.distributed, not as an argument (see its impl.py)
        assert "dapo-global-mask" not in declared
    assert _declared("liger") == _declared("liger-inplace")


@pytest.mark.parametrize("member", member_names())
def test_pytorch_matches_the_reference(member):
    spec = member_spec(member)
    fn = load_impl(IMPLEMENTATIONS / "pytorch")
    for seed in (0, 1):
        result = compare(fn, spec, seed)
        assert result.loss_ok and result.gradient_ok, result


def test_pytorch_keeps_the_seed_call():
    from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss

    fn = load_impl(IMPLEMENTATIONS / "pytorch")
    logits = torch.randn(2, 5, 33, dtype=torch.bfloat16)
    x = {"logits": logits, "completion_ids": torch.randint(0, 33, (2, 4)), "advantages": torch.tensor([0.7, -0.2])}
    leaf = logits.clone().requires_grad_()
    loss = fn(logits=leaf, completion_ids=x["completion_ids"], advantages=x["advantages"], epsilon_low=0.2,
              epsilon_high=0.28, temperature=1.3)
    loss.backward()
    p = GrpoParameters(0.2, 0.28, 1.3)
    assert float(loss.detach()) == pytest.approx(reference_loss(x, p), rel=1e-6)
    ref = reference_gradient_dense(x, p)
    assert float((leaf.grad.double() - ref).abs().max()) <= 1e-2 * float(ref.abs().max())  # bf16 gradient


def test_pytorch_rejects_an_unknown_loss_type():
    spec = member_spec("bnpo-mask")
    fn = load_impl(IMPLEMENTATIONS / "pytorch")
    with pytest.raises(ValueError, match="loss_type"):
        compare(lambda **kw: fn(**{**kw, "loss_type": "gmpo"}), spec)


LIGER_SCRIPT = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from member_cases import compare, load_impl, member_spec, ROOT
fn = load_impl(ROOT / "implementations" / sys.argv[2])
out = {}
for member in sys.argv[3:]:
    r = compare(fn, member_spec(member), 0)
    out[member] = {"loss_ok": r.loss_ok, "gradient_ok": r.gradient_ok, "detail": repr(r)}
print(json.dumps(out))
'''


@pytest.mark.slow
def test_liger_matches_the_reference_for_every_member_it_declares():
    pytest.importorskip("liger_kernel", reason="liger-kernel is an optional extra: pip install 'grpo-conform[liger]'")
    declared = _declared("liger")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", LIGER_SCRIPT, str(ROOT / "tests"), "liger", *declared],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    bad = {m: r["detail"] for m, r in results.items() if not (r["loss_ok"] and r["gradient_ok"])}
    assert set(results) == set(declared) and not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("member", ["sequence-offpolicy-mask"])  # one compile: Inductor on 2 CI cores is slow
def test_torch_compile_matches_the_reference(member):
    fn = load_impl(IMPLEMENTATIONS / "torch-compile")
    result = compare(fn, member_spec(member))
    assert result.loss_ok and result.gradient_ok, result
