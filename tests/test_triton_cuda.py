"""The bundled Triton implementation's GPU-only paths (the shared-memory staged kernels of
implementations/triton/staged.py, Gluon) against the float64 reference: every logits dtype, vocabularies
that take the staged path (multiples of 16: one chunk, several, a part-filled last chunk), vocabularies
whose rows start off 16-byte boundaries (the HEAD path, staged_rows.py and grad.py: also against the plain
kernels it replaced, configs "no-head") and rows neither path serves (the plain kernels). Skipped without CUDA (CI has
none); run on the device machine by benchmarks/h200_evidence.sh."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the staged kernels run on CUDA only", allow_module_level=True)

from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss  # noqa: E402

TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
WORST = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -9, torch.float32: 1e-5}  # one rounding of the dtype


def _load():
    name = "grpo_impl_triton_cuda_test"
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(ROOT / "implementations" / "triton")]
    sys.modules[name] = pkg
    return (importlib.import_module(name + ".impl"), importlib.import_module(name + ".launch"),
            importlib.import_module(name + ".configs"))


impl, launch, configs = _load()


def _inputs(dtype, batch, seq, vocab, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(batch, seq + 1, vocab, device="cuda", generator=g) * 2).to(dtype)
    logits[:, seq] = float("nan")  # never read
    ids = torch.randint(0, vocab, (batch, seq), device="cuda", generator=g)
    ids[0, 0] = vocab - 1  # the target in the last chunk
    # Rows of the spec's Student-t profile at their worst: one logit far above the rest (p = 1; the
    # H200 evidence run of 2026-11-30 caught the first staged kernel at 0.98 of this gradient) and
    # two tied ones (p = 1/2 each).
    huge = 60000.0 if dtype == torch.float16 else 413696.0
    logits[0, 1, vocab // 3] = huge
    logits[1, 2, 5] = logits[1, 2, vocab - 7] = huge
    adv = torch.randn(batch, device="cuda", generator=g)
    return logits, ids, adv


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("vocab", [1536, 5008, 20480, 32016, 128256, 4099, 37, 51, 131, 50257])
def test_loss_and_gradient_match_the_reference(dtype, vocab):
    logits, ids, adv = _inputs(dtype, 2, 5, vocab)
    params = GrpoParameters(0.2, 0.2, 0.7)
    p = launch.Problem.of(logits, 0.2, 0.2, 0.7)
    assert launch.staged_ok(logits, p) == (vocab % 16 == 0)
    assert launch.staged_rows(logits, p) == ("aligned" if vocab % 16 == 0 else "head")
    ref_loss = reference_loss(logits.cpu(), ids.cpu(), adv.cpu(), params)
    ref_grad = reference_gradient_dense(logits.cpu(), ids.cpu(), adv.cpu(), params)
    before = logits.clone()
    with torch.no_grad():
        forward = impl.grpo_loss(logits, ids, adv, 0.2, 0.2, 0.7)
    leaf = logits.clone().requires_grad_(True)
    loss = impl.grpo_loss(leaf, ids, adv, 0.2, 0.2, 0.7)
    loss.backward()
    for value in (float(forward), float(loss.detach())):
        assert value == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    grad = leaf.grad.double().cpu()
    assert torch.isfinite(grad[:, :5]).all()
    assert (grad[:, 5] == 0).all()  # the extra last position: exactly zero
    err = float((grad[:, :5] - ref_grad[:, :5]).norm() / ref_grad[:, :5].norm())
    assert err < TOLERANCE[dtype], f"relative Frobenius error {err:.2e}"
    worst = float((grad[:, :5] - ref_grad[:, :5]).abs().max() / ref_grad[:, :5].abs().max())
    assert worst < WORST[dtype], f"worst element off by {worst:.2e} of the largest"
    assert torch.equal(logits.view(torch.uint8), before.view(torch.uint8))  # the input bits are untouched


# ---- family members and the gradient-mode choice (plan.py, staged member kernels) -------------------------
from grpo_conform.ops.grpo_logits.reference import reference_loss as _ref_loss  # noqa: E402

MEMBER_CALLS = {
    "token-offpolicy-mask": dict(loss_type="grpo"),
    "token-offpolicy-mask-kl": dict(loss_type="grpo", beta=0.05, ref=True),
    "bnpo-mask": dict(loss_type="bnpo"),
    "dr-grpo-mask": dict(loss_type="dr_grpo", max_completion_length=9),
    "sequence-offpolicy-mask": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "cispo-mask": dict(loss_type="cispo", epsilon_high=5.0),
    "vllm-is-mask": dict(loss_type="grpo", rho=True, sampling_ratio_cap=1.5),
    # issue 33: TRL 1.16's defaults
    "token-offpolicy-mask-kl-bc": dict(loss_type="grpo", beta=0.05, ref=True, use_bias_correction_kl=True),
    "vllm-token-mask": dict(loss_type="grpo", rho=True, sampling_ratio_cap=1.5,
                            vllm_importance_sampling_mode="token_mask"),
    "vllm-sequence-truncate": dict(loss_type="grpo", rho=True, sampling_ratio_cap=1.5,
                                   vllm_importance_sampling_mode="sequence_truncate"),
    "vllm-sequence-mask": dict(loss_type="grpo", rho=True, sampling_ratio_cap=1.5,
                               vllm_importance_sampling_mode="sequence_mask"),
    "dapo-global-accum-mask": dict(loss_type="dapo", num_items_in_batch=3, num_processes=8,
                                   gradient_accumulation_steps=4, steps_per_generation=2),
    "sapo-mask": dict(loss_type="sapo", sapo_temperature_pos=0.9, sapo_temperature_neg=1.4),
    "luspo-mask": dict(loss_type="luspo"),
    "vespo-mask": dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5),
}


def _sequence_ratios(x):
    """TRL's sequence vLLM modes: sequence 0's kept sampling ratios multiply to 0.8, sequence 1's to 2.5
    (cap 1.5): one sequence kept, one dropped or truncated."""
    q, keep = x["sampling_ratio"].double(), x["completion_mask"]
    for b, target in ((0, 0.8), (1, 2.5)):
        n = int(keep[b].sum())
        prod = float(torch.log(q[b][keep[b]]).sum().exp())
        q[b] = torch.where(keep[b], q[b] * (target / prod) ** (1.0 / n), q[b])
    return {**x, "sampling_ratio": q.float()}


def _member_inputs(dtype, vocab, batch=3, seq=7, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(batch, seq + 1, vocab, device="cuda", generator=g) * 2).to(dtype)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda", generator=g)
    ids[0, 0] = vocab - 1
    lp = torch.log_softmax(logits[:, :seq].double() / 0.7, -1).gather(-1, ids[..., None])[..., 0]
    noise = lambda: 0.3 * torch.randn(batch, seq, device="cuda", generator=g, dtype=torch.float64)  # noqa: E731
    mask = torch.ones(batch, seq, dtype=torch.bool, device="cuda")
    mask[0, 4:] = False
    mask[2] = False
    return {"logits": logits, "completion_ids": ids, "advantages": torch.tensor([-0.7, 1.2, 0.4], device="cuda"),
            "old_logprobs": (lp + noise()).float(), "ref_logprobs": (lp + noise()).float(), "completion_mask": mask,
            "sampling_ratio": 0.5 + 1.5 * torch.rand(batch, seq, device="cuda", generator=g)}


CASES = [(m, v, torch.bfloat16) for m in sorted(MEMBER_CALLS) for v in (128256, 40001)]  # 40001: HEAD, 4 chunks
CASES += [("token-offpolicy-mask-kl", 5008, torch.float32), ("sequence-offpolicy-mask", 5008, torch.float16)]


@pytest.mark.parametrize("member,vocab,dtype", CASES, ids=str)
def test_member_matches_the_reference_for_every_upstream_scalar(member, vocab, dtype):
    from grpo_conform.ops.grpo_logits.reference import GrpoParameters as P

    cfg = dict(MEMBER_CALLS[member])
    use_ref, use_rho = cfg.pop("ref", False), cfg.pop("rho", False)
    params = {**dict(epsilon_low=0.2, epsilon_high=0.28, temperature=0.7, importance_sampling_level="token"), **cfg}
    x = _member_inputs(dtype, vocab)
    names = {"logits", "completion_ids", "advantages", "old_logprobs", "completion_mask"}
    names |= {"ref_logprobs"} if use_ref else set()
    names |= {"sampling_ratio"} if use_rho else set()
    x = {k: v for k, v in x.items() if k in names}
    if str(params.get("vllm_importance_sampling_mode", "")).startswith("sequence"):
        x = _sequence_ratios(x)
    p = P.from_mapping(params)
    cpu = {k: v.cpu() for k, v in x.items()}
    ref_loss = _ref_loss(cpu, p)
    ref_grad = reference_gradient_dense(cpu, p)
    seq = x["completion_ids"].shape[1]
    with torch.no_grad():
        assert float(impl.grpo_loss(**x, **params)) == pytest.approx(ref_loss, rel=2e-5, abs=2e-6)
    # The forward's prediction of d loss (plan.py): right (1), wrong, statistics, right (0.25), wrong, statistics,
    # right (1); a negative scalar last (wrong again).
    for c in (1.0, 0.25, 0.25, 0.25, 1.0, 1.0, 1.0, -3.0):
        leaf = x["logits"].clone().requires_grad_(True)
        loss = impl.grpo_loss(**{**x, "logits": leaf}, **params)
        (loss * c).backward()
        assert float(loss.detach()) == pytest.approx(ref_loss, rel=2e-5, abs=2e-6)
        grad = leaf.grad.double().cpu()
        assert torch.isfinite(grad).all() and (grad[:, seq] == 0).all() and (grad[2] == 0).all()
        err = float((grad[:, :seq] - c * ref_grad[:, :seq]).norm() / (c * ref_grad[:, :seq]).norm())
        assert err < TOLERANCE[dtype], f"c={c}: relative Frobenius error {err:.2e}"


# Every switch set the family launches (staged_members.member_constexprs): token-is, no optional input at all,
# is the set triton 3.6 crashed on before round 8's fix (notes); dr-grpo and dapo-global the constant weight.
STAGED_CALLS = {"token-is": {}, **MEMBER_CALLS, "dapo-global-mask": dict(loss_type="dapo", num_items_in_batch=9,
                                                                             num_processes=2),
                "token-offpolicy-mask-delta": dict(loss_type="grpo", delta=1.1)}


@pytest.mark.parametrize("member", sorted(STAGED_CALLS))
def test_staged_member_kernels_compiled(member):
    """The Gluon member kernels must have run, not fallen back to the plain ones (staged_members.DISABLED is
    empty and the plan holds the staged launches), and the gradient must still match the reference."""
    from grpo_conform.ops.grpo_logits.reference import GrpoParameters as P

    staged_members = importlib.import_module("grpo_impl_triton_cuda_test.staged_members")
    cfg = dict(STAGED_CALLS[member])
    use_ref, use_rho = cfg.pop("ref", False), cfg.pop("rho", False)
    params = {**dict(epsilon_low=0.19, epsilon_high=0.27, temperature=0.7), **cfg}  # plans of their own
    x = _member_inputs(torch.bfloat16, 128256)
    names = {"logits", "completion_ids", "advantages"}
    names |= set() if member == "token-is" else {"old_logprobs", "completion_mask"}
    names |= {"ref_logprobs"} if use_ref else set()
    names |= {"sampling_ratio"} if use_rho else set()
    x = {k: v for k, v in x.items() if k in names}
    if str(params.get("vllm_importance_sampling_mode", "")).startswith("sequence"):
        x = _sequence_ratios(x)
    before = set(impl._PLANS)
    for c in (1.0, 0.25):  # gradient in the forward's pass, then (mispredicted) recomputed in backward
        leaf = x["logits"].clone().requires_grad_(True)
        (impl.grpo_loss(**{**x, "logits": leaf}, **params) * c).backward()
    with torch.no_grad():
        impl.grpo_loss(**x, **params)  # the loss only (the statistics kernel where the loss reads the logits)
    assert staged_members.DISABLED == []
    plans = [impl._PLANS[k] for k in set(impl._PLANS) - before]
    assert plans and all(p.staged is not None for p in plans)
    launched = set().union(*(p.l_staged for p in plans))
    coupled = params.get("importance_sampling_level") == "sequence" or params.get("loss_type") == "vespo"
    want = {"stats"} if coupled else \
        {"main-backward"} if member == "token-is" else {"main"}  # token-is: the loss reads no logits (deferred)
    assert launched >= want, launched
    cpu = {k: v.cpu() for k, v in x.items()}
    ref_grad = reference_gradient_dense(cpu, P.from_mapping({"importance_sampling_level": "token", **params}))
    grad = leaf.grad.double().cpu()
    seq = x["completion_ids"].shape[1]
    err = float((grad[:, :seq] - 0.25 * ref_grad[:, :seq]).norm() / (0.25 * ref_grad[:, :seq]).norm())
    assert err < TOLERANCE[torch.bfloat16], f"relative Frobenius error {err:.2e}"


@pytest.mark.parametrize("vocab,config", [(128256, "shipped"), (40001, "shipped"), (40001, "no-head")], ids=str)
def test_token_is_backward_reads_d_loss(vocab, config):
    """token-is is deferred (plan.Plan.deferred): the forward reads no logits, and backward's one kernel
    computes the statistics and writes d loss * gradient; any d loss, twice through a retained graph.
    Staged (13 chunks), staged HEAD (4 chunks) and the plain kernels (3 chunks, waiting)."""
    with configs.forced(config):
        impl._PLANS.clear()
        _token_is_backward(vocab)
    impl._PLANS.clear()


def _token_is_backward(vocab):
    logits, ids, adv = _inputs(torch.bfloat16, 3, 6, vocab, seed=5)
    params = GrpoParameters(0.2, 0.28, 0.7)
    ref_grad = reference_gradient_dense(logits.cpu(), ids.cpu(), adv.cpu(), params)[:, :6]
    for c in (1.0, 0.25, -3.0, 1e-6):
        leaf = logits.clone().requires_grad_(True)
        loss = impl.grpo_loss(leaf, ids, adv, 0.2, 0.28, 0.7)
        assert loss.grad_fn.grad is None  # nothing written in forward
        (loss * c).backward()
        grad = leaf.grad.double().cpu()
        assert (grad[:, 6] == 0).all()
        err = float((grad[:, :6] - c * ref_grad).norm() / (abs(c) * ref_grad.norm()))
        assert err < TOLERANCE[torch.bfloat16], f"c={c}: relative Frobenius error {err:.2e}"
    leaf = logits.clone().requires_grad_(True)
    loss = impl.grpo_loss(leaf, ids, adv, 0.2, 0.28, 0.7)
    loss.backward(retain_graph=True)
    loss.backward()
    err = float((leaf.grad.double().cpu()[:, :6] - 2 * ref_grad).norm() / (2 * ref_grad.norm()))
    assert err < TOLERANCE[torch.bfloat16], f"second backward: relative Frobenius error {err:.2e}"


# ---- rows off 16-byte boundaries: the staged HEAD path against the plain kernels it replaced ---------------
HEAD_CASES = [(m, 131, torch.bfloat16) for m in sorted(STAGED_CALLS)]
HEAD_CASES += [(m, v, d) for m in ("token-is", "token-offpolicy-mask-kl", "sequence-offpolicy-mask", "dapo-mask")
               if m in STAGED_CALLS for v in (37, 51) for d in (torch.float16, torch.float32)]
HEAD_CASES += [(m, 50257, torch.bfloat16) for m in ("token-is", "token-offpolicy-mask", "sequence-offpolicy-mask")]


def _member_call(member, dtype, vocab):
    cfg = dict(STAGED_CALLS[member])
    use_ref, use_rho = cfg.pop("ref", False), cfg.pop("rho", False)
    params = {**dict(epsilon_low=0.2, epsilon_high=0.28, temperature=0.7), **cfg}
    x = _member_inputs(dtype, vocab)
    names = {"logits", "completion_ids", "advantages"}
    names |= set() if member == "token-is" else {"old_logprobs", "completion_mask"}
    names |= {"ref_logprobs"} if use_ref else set()
    names |= {"sampling_ratio"} if use_rho else set()
    x = {k: v for k, v in x.items() if k in names}
    if str(params.get("vllm_importance_sampling_mode", "")).startswith("sequence"):
        x = _sequence_ratios(x)
    return x, params


def _run_member(x, params, config):
    """(forward loss, [(loss, gradient) at d loss 1, 0.25, 1]) under a forced launch configuration, and
    the plans it built."""
    with configs.forced(config):
        impl._PLANS.clear()
        with torch.no_grad():
            forward = float(impl.grpo_loss(**x, **params))
        calls = []
        for c in (1.0, 0.25, 1.0):  # predicted, mispredicted (recomputed from the statistics), predicted
            leaf = x["logits"].clone().requires_grad_(True)
            loss = impl.grpo_loss(**{**x, "logits": leaf}, **params)
            (loss * c).backward()
            calls.append((float(loss.detach()), leaf.grad.double().cpu() / c))
        plans = list(impl._PLANS.values())
    impl._PLANS.clear()
    return forward, calls, plans


@pytest.mark.parametrize("member,vocab,dtype", HEAD_CASES, ids=str)
def test_head_path_matches_the_plain_kernels(member, vocab, dtype):
    """Every member the staged kernels serve, at vocabularies whose rows start off 16-byte boundaries: the
    staged HEAD launch (shipped) and the plain kernels (configs "no-head", what ran there before) give the
    same loss and, element by element, the same gradient to one rounding of the dtype; both match the
    float64 reference."""
    from grpo_conform.ops.grpo_logits.reference import GrpoParameters as P

    staged_members = importlib.import_module("grpo_impl_triton_cuda_test.staged_members")
    x, params = _member_call(member, dtype, vocab)
    head_fwd, head, plans = _run_member(x, params, "shipped")
    assert staged_members.DISABLED == []
    assert plans and all(p.staged is not None and p.staged_head and p.grad_head for p in plans)
    plain_fwd, plain, plans = _run_member(x, params, "no-head")
    assert plans and all(p.staged is None and not p.grad_head for p in plans)
    cpu = {k: v.cpu() for k, v in x.items()}
    p = P.from_mapping({"importance_sampling_level": "token", **params})
    ref_loss, ref_grad = _ref_loss(cpu, p), reference_gradient_dense(cpu, p)
    seq = x["completion_ids"].shape[1]
    assert head_fwd == pytest.approx(plain_fwd, rel=2e-5, abs=2e-6)
    assert head_fwd == pytest.approx(ref_loss, rel=2e-5, abs=2e-6)
    for (hl, hg), (pl, pg) in zip(head, plain):
        assert hl == pytest.approx(pl, rel=2e-5, abs=2e-6)
        assert torch.isfinite(hg).all() and (hg[:, seq] == 0).all()
        scale = float(pg.abs().max())
        worst = float((hg - pg).abs().max()) / scale
        assert worst <= 2 * WORST[dtype], f"HEAD against plain: worst element off by {worst:.2e} of the largest"
        err = float((hg[:, :seq] - ref_grad[:, :seq]).norm() / ref_grad[:, :seq].norm())
        assert err < TOLERANCE[dtype], f"relative Frobenius error {err:.2e}"


def test_rows_neither_path_serves_run_the_plain_kernels():
    """A row no longer than its head could be (V < 16 elements: launch.row_layout) takes the plain kernels,
    still right. (Strided views never reach a plan: impl.py copies them, so a fresh contiguous tensor always
    has a 16-byte aligned base and rows whose logits and gradient offsets agree.)"""
    logits, ids, adv = _inputs(torch.bfloat16, 2, 5, 12, seed=7)
    p = launch.Problem.of(logits, 0.2, 0.2, 0.7)
    assert launch.staged_rows(logits, p) is None
    ref_grad = reference_gradient_dense(logits.cpu(), ids.cpu(), adv.cpu(), GrpoParameters(0.2, 0.2, 0.7))[:, :5]
    impl._PLANS.clear()
    leaf = logits.clone().requires_grad_(True)
    impl.grpo_loss(leaf, ids, adv, 0.2, 0.2, 0.7).backward()
    assert [(pl.staged, pl.grad_head) for pl in impl._PLANS.values()] == [(None, False)]
    err = float((leaf.grad.double().cpu()[:, :5] - ref_grad).norm() / ref_grad.norm())
    assert err < TOLERANCE[torch.bfloat16], f"relative Frobenius error {err:.2e}"
    impl._PLANS.clear()
