"""Measured evidence for the float16 tolerance of the spec family (specs/grpo.v1.json, issue 10
point 12): honest kernels on fp16 logits against the float64 reference, error split by element
size, and what the tolerance allows. CPU only (the Triton kernel under TRITON_INTERPRET=1).

    TRITON_INTERPRET=1 python3 benchmarks/fp16_tolerance.py [--triton]   # prints one JSON object
"""
import importlib, json, random, sys, types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grpo_conform.compare import GradientComparator  # noqa: E402
from grpo_conform.ops.grpo_logits.inputs import generate  # noqa: E402
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss, row_scales  # noqa: E402
from grpo_conform.spec import draw_parameters, find_spec  # noqa: E402


def load(name):
    pkg = types.ModuleType("m_" + name.replace("-", "_"))
    pkg.__path__ = [str(ROOT / "implementations" / name)]
    sys.modules[pkg.__name__] = pkg
    return importlib.import_module(pkg.__name__ + ".impl").grpo_loss


def stats(grad, ref, scale):
    err = (grad.double() - ref).abs()
    s = scale.view(ref.shape[:2]).unsqueeze(-1).expand_as(ref)
    keep = s > 0
    e, err, s = ref[keep], err[keep], s[keep]
    tiny = e.abs() < 6.1e-5  # below fp16's smallest normal: subnormal or 0 after rounding
    normal = ~tiny
    rows = (grad.double() - 0).sum(-1)[scale.view(ref.shape[:2]) > 0] / scale.view(ref.shape[:2])[scale.view(ref.shape[:2]) > 0]
    return {
        "elements": int(e.numel()), "subnormal_or_zero_expected": int(tiny.sum()),
        "max_rel_err_normal": float((err[normal] / e[normal].abs()).max()) if normal.any() else 0.0,
        "max_abs_err_subnormal": float(err[tiny].max()) if tiny.any() else 0.0,
        "max_err_over_s_after_rtol_0.005": float(((err - 0.005 * e.abs()).clamp_min(0) / s).max()),
        "frobenius_rel": float((grad.double() - ref).norm() / ref.norm()),
        "max_row_sum_over_s": float(rows.abs().max()),
    }


def run(impl, member, workload, seeds, profiles=None):
    spec = find_spec(member)
    out = []
    for seed in range(seeds):
        rw = spec.resolve(spec.workload(workload), random.Random(seed))
        values = draw_parameters(spec, random.Random(seed))
        x = generate(spec, rw, 1000 + seed, "cpu", profiles=profiles, values=values).tensors
        p = GrpoParameters.from_spec(spec, values)
        leaf = x["logits"].clone().requires_grad_(True)
        call = {k: v for k, v in x.items() if k != "logits"}
        loss = impl(logits=leaf, **call, **{q.name: values[q.name] for q in spec.parameters})
        loss.backward()
        ref = reference_gradient_dense(x, p)
        st = stats(leaf.grad, ref, row_scales(x, p, x["logits"].shape[1]))
        st["loss_rel_err"] = abs(float(loss.detach()) - reference_loss(x, p)) / max(1e-12, abs(reference_loss(x, p)))
        c = GradientComparator(spec.tolerance("float16").gradient, x["logits"].shape[1], x["logits"].shape[2])
        c.update(0, leaf.grad.view(-1, c.vocab), ref.view(-1, c.vocab), row_scales(x, p, c.seq_next))
        st["fails_member_tolerance"] = int(not c.passed or c.row_sum_failures > 0)
        out.append(st)
    return {k: max(o[k] for o in out) for k in out[0]}


def hostile(member, workload, seed=0):
    """An fp16 gradient that is honest except 100% wrong (zeroed) on elements below 1e-3 of the row scale."""
    spec = find_spec(member)
    rw = spec.resolve(spec.workload(workload), random.Random(seed))
    values = draw_parameters(spec, random.Random(seed))
    x = generate(spec, rw, 77, "cpu", values=values).tensors
    p = GrpoParameters.from_spec(spec, values)
    ref = reference_gradient_dense(x, p)
    s = row_scales(x, p, x["logits"].shape[1]).view(ref.shape[:2]).unsqueeze(-1)
    g = ref.to(torch.float16).double()
    small = ref.abs() < 1e-3 * s
    g[small] = 0.0
    return {"zeroed_elements": int(small.sum()), "max_zeroed_over_s": float((ref.abs() / s.clamp_min(1e-300))[small].max())}


if __name__ == "__main__":
    result = {"pytorch": {}, "triton": {}}
    for member, workload in (("grpo/token-is", "fp16-small"), ("grpo/token-offpolicy-mask", "mask-fp16"),
                             ("grpo/token-offpolicy-mask-kl", "mask-fp16")):
        for prof in (None, ["normal", "large", "peaked", "heavy_tailed", "wide"]):
            key = f"{member}:{workload}:{'adversarial' if prof else 'base'}"
            result["pytorch"][key] = run(load("pytorch"), member, workload, 6, prof)
    if "--triton" in sys.argv:
        for prof in (None, ["normal", "large", "peaked", "heavy_tailed", "wide"]):
            result["triton"][f"grpo/token-is:fp16-small:{'adversarial' if prof else 'base'}"] = run(load("triton"), "grpo/token-is", "fp16-small", 2, prof)
    result["hostile"] = hostile("grpo/token-is", "fp16-small")
    print(json.dumps(result, indent=1))
