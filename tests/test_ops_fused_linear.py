"""grpo-fused-linear (issue 31): the chunked float64 reference against torch autograd in float64 on the
unchunked formula (loss and the gradients of hidden, weight and bias), chunk sizes that do not divide
the rows or the vocabulary, bias absent and present, KL given and through a reference weight, the
on-policy loss -mean(A), the per-unit scales, seeded generation, the registry and the work terms."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
import torch

from grpo_conform.ops import OPERATIONS, operation_for
from grpo_conform.ops.fused_linear.reference import Blocks, dense_gradients, reference_gradients, reference_loss
from grpo_conform.ops.grpo_terms import GrpoParameters

B, T, H, V = 2, 5, 6, 13  # 10 rows: 4 and 3 divide neither rows nor V
CHUNKS = [Blocks(1, 5), Blocks(4, 3), Blocks(3, 1), Blocks(7, 13), Blocks(64, 64)]
OP = OPERATIONS["grpo-fused-linear"]


def _inputs(seed: int, *, bias=True, mask=False, old=False, ref=None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = {"hidden": torch.randn(B, T, H, generator=g, dtype=torch.float64),
         "weight": torch.randn(V, H, generator=g, dtype=torch.float64),
         "completion_ids": torch.randint(0, V, (B, T), generator=g),
         "advantages": torch.tensor([0.8, -1.3])}
    if bias:
        x["bias"] = torch.randn(V, generator=g, dtype=torch.float64)
    if mask:
        x["completion_mask"] = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    if old:  # ratios spread across the clip region
        x["old_logprobs"] = -1.5 + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    if ref == "given":
        x["ref_logprobs"] = -1.5 + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    elif ref == "weight":
        x["ref_weight"] = x["weight"] + 0.3 * torch.randn(V, H, generator=g, dtype=torch.float64)
        x["ref_hidden"] = x["hidden"] + 0.3 * torch.randn(B, T, H, generator=g, dtype=torch.float64)
    return x


def _autograd(x, p: GrpoParameters):
    """The unchunked formula, written out, differentiated by autograd in float64."""
    leaves = {k: x[k].clone().requires_grad_() for k in ("hidden", "weight", "bias") if k in x}
    z = leaves["hidden"] @ leaves["weight"].T + (leaves["bias"] if "bias" in leaves else 0.0)
    ids = x["completion_ids"].unsqueeze(-1)
    logp = torch.log_softmax(z / p.temperature, -1).gather(-1, ids).squeeze(-1)
    old = x["old_logprobs"] if "old_logprobs" in x else logp.detach()
    r = torch.exp(logp - old)
    A = x["advantages"].double()[:, None]
    per_token = -torch.minimum(r * A, r.clamp(1 - p.epsilon_low, 1 + p.epsilon_high) * A)
    ref = x.get("ref_logprobs")
    if "ref_weight" in x:
        zr = x.get("ref_hidden", x["hidden"]) @ x["ref_weight"].T
        ref = torch.log_softmax(zr / p.temperature, -1).gather(-1, ids).squeeze(-1)
    if ref is not None and p.beta:
        d = ref - logp
        per_token = per_token + p.beta * (torch.exp(d) - d - 1)
    m = x.get("completion_mask", torch.ones(B, T)).double()
    loss = ((per_token * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()  # loss_type grpo
    loss.backward()
    return loss.item(), {k: v.grad for k, v in leaves.items()}


CASES = {
    "on-policy": dict(kw={}, p={}),
    "no-bias": dict(kw=dict(bias=False), p={}),
    "masked-off-policy": dict(kw=dict(mask=True, old=True), p=dict(temperature=0.7)),
    "kl-given": dict(kw=dict(mask=True, old=True, ref="given"), p=dict(beta=0.1)),
    "kl-through-ref-weight": dict(kw=dict(old=True, ref="weight"), p=dict(beta=0.04, temperature=1.3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_reference_equals_autograd_on_the_unchunked_formula(case):
    c = CASES[case]
    x = _inputs(1 + len(case), **c["kw"])
    p = GrpoParameters(0.2, 0.28, **{"temperature": 1.0, **c["p"]})
    want_loss, want = _autograd(x, p)
    assert set(want) == ({"hidden", "weight", "bias"} if "bias" in x else {"hidden", "weight"})
    for blocks in CHUNKS:
        assert reference_loss(x, p, blocks) == pytest.approx(want_loss, rel=1e-12, abs=1e-14)
        got = dense_gradients(x, p, blocks)
        assert set(got) == set(want)
        for name in want:
            assert got[name].shape == x[name].shape
            torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-13, msg=f"{case} {blocks} {name}")
            assert want[name].abs().max() > 1e-4  # the comparison is not between zeros


def test_on_policy_loss_is_minus_mean_advantage_as_in_the_logits_operation():
    x = _inputs(5)
    p = GrpoParameters(0.2, 0.2, 1.0)
    assert reference_loss(x, p, Blocks(3, 4)) == pytest.approx(-float(x["advantages"].double().mean()), abs=1e-15)


def test_kl_through_a_reference_weight_equals_kl_with_those_log_probs_given():
    x = _inputs(9, old=True, ref="weight")
    p = GrpoParameters(0.2, 0.2, 1.0, beta=0.1)
    zr = x["ref_hidden"] @ x["ref_weight"].T
    given = {k: v for k, v in x.items() if not k.startswith("ref_")}
    given["ref_logprobs"] = torch.log_softmax(zr, -1).gather(-1, x["completion_ids"].unsqueeze(-1)).squeeze(-1)
    assert reference_loss(x, p) == pytest.approx(reference_loss(given, p), rel=1e-13)
    assert reference_loss(x, p) != pytest.approx(reference_loss({**given, "ref_logprobs": given["ref_logprobs"] + 0.5}, p))


def test_every_unit_scale_bounds_its_elements_and_chunks_tile_the_units():
    x = _inputs(3, mask=True, old=True, ref="given")
    p = GrpoParameters(0.2, 0.2, 0.9, beta=0.2)
    for name, chunks in reference_gradients(x, p, Blocks(4, 3)).items():
        stops = 0
        for c in chunks:
            assert c.start == stops and c.values.shape[0] == c.stop - c.start == c.scale.shape[0]
            stops = c.stop
            assert bool((c.values.abs().amax(-1) <= c.scale * (1 + 1e-12)).all()), name
        assert stops == (B * T if name == "hidden" else V)


def _spec(names, seed_spec, **params):
    def t(name, shape, dtypes):
        return NS(name=name, shape=shape, dtypes=dtypes)
    shapes = {"hidden": ("batch", "seq", "hidden"), "weight": ("vocab", "hidden"), "bias": ("vocab",),
              "completion_ids": ("batch", "seq"), "advantages": ("batch",), "completion_mask": ("batch", "seq"),
              "old_logprobs": ("batch", "seq"), "ref_logprobs": ("batch", "seq")}
    dt = {"completion_ids": ["int64"], "completion_mask": ["bool"], "hidden": ["bfloat16"], "weight": ["bfloat16"],
          "bias": ["bfloat16"]}
    inputs = [t(n, shapes[n], dt.get(n, ["float32"])) for n in names]
    axes = dict(batch=3, seq=4, hidden=32, vocab=97)
    spec = NS(inputs=inputs, outputs=[NS(name="loss", shape=(), dtypes=["float32"])],
              gradients=[NS(input=n) for n in ("hidden", "weight", "bias") if n in names],
              validation=seed_spec.validation, input=lambda n: next(i for i in inputs if i.name == n),
              parameter_values={"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0, **params},
              operation="grpo-fused-linear", terms=NS(kl=NS(present="ref_logprobs" in names)), parameters=[])
    sh = {i.name: tuple(axes[a] for a in i.shape) for i in inputs}
    rw = NS(axes=axes, shapes=sh, dtypes={}, workload=NS(timed=False, name="tiny"), numel=lambda n: math.prod(sh[n]))
    return spec, rw


def test_registry_resolves_the_name_and_generation_is_seeded(spec):
    names = ["hidden", "weight", "bias", "completion_ids", "advantages", "completion_mask", "old_logprobs", "ref_logprobs"]
    fspec, rw = _spec(names, spec, beta=0.1)
    op = operation_for(fspec)
    assert op is OP and op.name == "grpo-fused-linear"
    a, b, c = (op.generate(fspec, rw, s, "cpu", case=0) for s in (7, 7, 8))
    assert all(torch.equal(a[k], b[k]) for k in names) and not torch.equal(a["hidden"], c["hidden"])
    assert a["hidden"].dtype == torch.bfloat16 and a["hidden"].shape == (3, 4, 32) and a["weight"].shape == (97, 32)
    # old log-probs sit across the clip regions, drawn from the rounded inputs' float64 log-probs
    x64 = {k: (v.double() if v.is_floating_point() else v) for k, v in a.tensors.items() if k in ("hidden", "weight", "bias")}
    z = x64["hidden"] @ x64["weight"].T + x64["bias"]
    logp = torch.log_softmax(z, -1).gather(-1, a["completion_ids"].unsqueeze(-1)).squeeze(-1)
    r = torch.exp(logp - a["old_logprobs"].double())
    assert bool((r < 0.8).any()) and bool((r > 1.2).any()) and bool(((r > 0.8) & (r < 1.2)).any())
    params = op.parameters(fspec, {})
    assert math.isfinite(op.reference_loss(fspec, a.tensors, params))
    grads = {k: torch.cat([ch.values for ch in v]) for k, v in op.reference_gradients(fspec, a.tensors, params).items()}
    assert {k: tuple(v.shape) for k, v in grads.items()} == {"hidden": (12, 32), "weight": (97, 32), "bias": (97, 1)}
    groupings = op.gradient_groupings(fspec)
    assert [groupings[n].units(rw) * groupings[n].width(rw) for n in ("hidden", "weight", "bias")] == [12 * 32, 97 * 32, 97]


def test_work_terms_count_the_gemms_per_protocol(spec):
    fspec, rw = _spec(["hidden", "weight", "completion_ids", "advantages", "old_logprobs"], spec)
    gemm = 2 * 12 * 32 * 97
    assert OP.arithmetic(fspec, rw, None, "forward").flops == gemm
    assert OP.arithmetic(fspec, rw, None, "full").flops == 3 * gemm
    assert OP.arithmetic(fspec, rw, None, "backward").flops == 0
    assert OP.arithmetic(fspec, rw, None).exponentials == 12 * 97
    itemsize = {"bfloat16": 2, "float32": 4, "int64": 8}.get
    fwd, _ = OP.traffic(fspec, rw, "forward", None, itemsize)
    full, _ = OP.traffic(fspec, rw, "full", None, itemsize)
    assert sum(i.bytes for i in full) - sum(i.bytes for i in fwd) == (12 * 32 + 97 * 32) * 2  # d hidden, d weight
    assert OP.workload_size(fspec, rw).tensor == "weight"


def test_a_forward_whose_loss_reads_no_logprobs_has_no_gemm_and_reads_only_the_advantages(spec):
    """On-policy without KL the ratio is exactly 1: the loss value is a function of the advantages (and the
    mask), so forward needs no GEMM (the first H200 record of triton-fused was "below the floor" without this)."""
    itemsize = {"bfloat16": 2, "float32": 4, "int64": 8, "bool": 1}.get
    for names, reads in ((["hidden", "weight", "completion_ids", "advantages"], {"advantages"}),
                         (["hidden", "weight", "bias", "completion_ids", "advantages", "completion_mask"],
                          {"advantages", "completion_mask"})):
        fspec, rw = _spec(names, spec)
        fwd, _ = OP.traffic(fspec, rw, "forward", None, itemsize)
        assert {i.tensor for i in fwd if i.direction == "read"} == reads
        read = {i.tensor: i.bytes for i in fwd if i.direction == "read"}  # what floors pass to arithmetic
        assert OP.gemms(fspec, rw, "forward") == () and OP.arithmetic(fspec, rw, read, "forward").exponentials == 0
        assert OP.arithmetic(fspec, rw, read, "forward").flops == 0
        assert len(OP.gemms(fspec, rw, "full")) == 3  # the gradient still needs every GEMM
    for extra in ("old_logprobs", "ref_logprobs"):  # the ratio or the KL term reads logp: the logits GEMM stays
        fspec, rw = _spec(["hidden", "weight", "completion_ids", "advantages", extra], spec)
        assert len(OP.gemms(fspec, rw, "forward")) == 1
    fspec, rw = _spec(["hidden", "weight", "completion_ids", "advantages"], spec, loss_type="cispo")
    assert len(OP.gemms(fspec, rw, "forward")) == 1  # CISPO's weight multiplies logp itself


# -- the spec family file (specs/grpo-fused-linear.v1.json), loaded by the spec loader ------------------------

FUSED_FAMILY = "specs/grpo-fused-linear.v1.json"


def _members():
    from grpo_conform.spec import load_family

    return {m.family.member: m for m in load_family(FUSED_FAMILY).members()}


def test_the_fused_family_validates_and_every_member_runs_through_the_operation():
    members = _members()
    assert {"token-is", "token-offpolicy-mask", "token-offpolicy-mask-kl", "token-offpolicy-mask-kl-ref-weight"} <= set(members)
    seeds = {w.name: w for w in members["token-is"].workloads if w.name.startswith("seed-")}
    assert {n: (w.axes["batch"], w.axes["seq"], w.axes["hidden"], w.axes["vocab"], w.devices) for n, w in seeds.items()} == {
        f"seed-b{b}": (b, 1024, 4096, 128256, ("cuda",)) for b in (2, 4, 8, 16)}
    for name, member in members.items():
        op = operation_for(member)
        assert op is OP, name
        rw = member.resolve(member.workload("tiny-bf16"))
        x = op.generate(member, rw, 3, "cpu", case=0)
        assert set(x.tensors) == {t.name for t in member.inputs}
        params = op.parameters(member, {})
        assert math.isfinite(op.reference_loss(member, x.tensors, params))
        grads = op.reference_gradients(member, x.tensors, params)
        assert set(grads) == {g.input for g in member.gradients} == set(op.gradient_groupings(member))
        if name == "token-is":  # the seed semantics: -mean(A)
            want = -float(x["advantages"].double().mean())
            assert op.reference_loss(member, x.tensors, params) == pytest.approx(want, abs=1e-12)


# -- floors: the FLOP floor (dense tensor-core peaks in the catalogue) ------------------------------------


def test_fused_floors_take_the_larger_of_dram_and_the_gemm_flops():
    from grpo_conform.floors import compute_floor
    from grpo_conform.hardware import load_catalogue

    cat = load_catalogue()
    member = _members()["token-offpolicy-mask"]  # its forward reads the log-probs (token-is's does not)
    rw = member.resolve(member.workload("seed-b2"))
    gemm = 2 * (2 * 1024) * 4096 * 128256
    for gid, tflops in (("h200-sxm", 989), ("a100-sxm4-80gb", 312)):
        gpu = cat.get(gid)
        assert gpu.flops_per_s("bfloat16") == tflops * 1e12 and gpu.flops_per_s("float32") is None
        for protocol, gemms in (("forward", 1), ("full", 3)):
            f = compute_floor(member, rw, protocol, gpu)
            want = math.floor(gemms * gemm / (tflops * 1e12) * 1e9)
            assert f.arithmetic_ns == want and f.binding == "arithmetic" and f.floor_ns == want > f.dram_ns
            assert any("tensor cores" in line and f"{tflops:g} TFLOP/s" in line for line in f.derivation)
    f = compute_floor(member, rw, "full", cat.get("l4"))  # no tensor-core peak in the catalogue: no FLOP floor
    assert f.binding != "arithmetic" or f.arithmetic_ns < math.floor(3 * gemm / 989e12 * 1e9)
    assert any("no FLOP floor" in line for line in f.derivation)


def test_the_logits_operation_floors_do_not_change(spec):
    """grpo-logits declares no FLOPs: its floors are the ones computed before the FLOP floor existed
    (pinned from that code: seed-b2, the seed page's 257.9 us headroom forward floor on the A100 80GB)."""
    from grpo_conform.floors import compute_floor
    from grpo_conform.hardware import load_catalogue

    cat = load_catalogue()
    rw = spec.resolve(spec.workload("seed-b2"))
    pinned = {("a100-sxm4-80gb", "forward", "headroom-v1"): (257903, 107806, "dram"),
              ("a100-sxm4-80gb", "full", "traffic-v1"): (515548, 107806, "dram"),
              ("h200-sxm", "forward", "headroom-v1"): (109555, 62812, "dram"),
              ("h200-sxm", "full", "traffic-v1"): (219000, 62812, "dram")}
    for (gid, protocol, model), want in pinned.items():
        f = compute_floor(spec, rw, protocol, cat.get(gid), model=model)
        assert (f.floor_ns, f.arithmetic_ns, f.binding) == want
        assert not any("tensor cores" in line for line in f.derivation)


def test_a_catalogue_peak_needs_its_source():
    from pydantic import ValidationError

    from grpo_conform.hardware import load_catalogue

    entry = load_catalogue().get("h200-sxm").model_dump()
    with pytest.raises(ValidationError, match="tensor_basis"):
        type(load_catalogue().get("h200-sxm"))(**{**entry, "tensor_basis": ""})


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_the_allowance_moves_a_ratio_onto_a_clip_bound_whenever_the_log_prob_errors_can(level):
    """A sequence's ratio is the mean of its tokens' log-ratios: with d = [0.1, 0.0001] it can move by
    0.05 and so reach a bound 0.04 away. One shift clipped to each token's d moved it by 0.02 only, and
    a sequence the implementation put across the bound was not covered (moves.bound_shifts)."""
    from grpo_conform.ops.fused_linear.moves import bound_shifts as _shifts

    p = GrpoParameters.from_mapping({"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0,
                                    "importance_sampling_level": level})
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    grid = torch.tensor([[0.1, 0.0001]], dtype=torch.float64)
    bound = math.log(1.2)
    old = logp - (bound - 0.04)  # every token's log-ratio 0.04 below the upper bound
    x = {"old_logprobs": old, "completion_mask": torch.ones(1, 2, dtype=torch.bool)}
    shifts = _shifts(x, p, logp, grid)
    assert all(bool((s.abs() <= grid + 1e-15).all()) for s in shifts)  # never past a token's own d

    def reached(values):  # within a hair of the bound, on both sides of it
        near = [v - bound for v in values if abs(v - bound) < 1e-9]
        return any(v < 0 for v in near) and any(v > 0 for v in near)

    if level == "sequence":
        assert reached([float((logp + s - old).mean()) for s in shifts])
    else:  # a token reaches the bound only within its own d: the first can, the second cannot
        assert reached([float((logp + s - old)[0, 0]) for s in shifts])
        assert not any(abs(float((logp + s - old)[0, 1]) - bound) < 1e-9 for s in shifts)
