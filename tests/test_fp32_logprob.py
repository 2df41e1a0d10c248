"""The fp32 log-prob error through the importance ratio (docs/checks.md, "fp32 log-prob error through
the ratio"): an honest fp32 log-softmax misses logp by up to ~eps * max|z|/T, the ratio exp(logp - old)
carries that into whole gradient rows and into the loss (CISPO's also through its detached weight).
The judgment allows the derived bound where the inputs need it, and no more than wrong members survive.

Everything but the last test runs the real judgment (`WorkloadConformance.judge`, the objects a
check builds) in this process on the adversarial probe's inputs, derived from the workload's two
seeds exactly as `probes.adversarial` derives them; the last runs `run_check` with the seeds pinned.
"""

from __future__ import annotations

import functools
import math
import itertools
import random
import types
from pathlib import Path

import pytest
import torch

from grpo_conform.ops.grpo_logits import inputs as gen
from grpo_conform.checks import judging as J
from grpo_conform.checks.buffers import InputSlot
from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.compare import (
    LOGP_RESOLUTION, SUM_RESOLUTION, GradientComparator, LossComparison, describe_outputs, fp32_logp_error,
)
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_logprobs
from grpo_conform.ops.grpo_terms import needs_logprobs, token_terms
from grpo_conform.spec import find_spec
from in_process import load_module

ROOT = Path(__file__).resolve().parent.parent
RATIO_MEMBERS = ("token-offpolicy-mask", "token-offpolicy-mask-kl", "bnpo-mask", "dr-grpo-mask", "dapo-mask",
                 "sequence-offpolicy-mask", "token-offpolicy-mask-delta", "cispo-mask", "dapo-global-mask",
                 "vllm-is-mask", "token-offpolicy-mask-kl-bc")
# (member, seeds[0], seeds[1]) -> what the judgment failed before the log-prob terms (found by the
# seed search over implementations/pytorch, and through run_check: docs/spec-family.md)
# Found under the parameter draws of grpo_conform/spec/draws.py as they are now (a change of the draw rules
# moves every seed's parameters: DEFAULT_AWAY re-pinned these on 2026-12-02; the first pins are in
# docs/spec-family.md).
PINNED = {  # re-pinned when the richest row took the largest |A| (zero_apart, 2026-12-07; draws Random(900000 + i),
    # i = 21, 0, 21; before: i = 26, 22, 84 from 2026-12-05's row blocks, and i = 124, 4, 124 from issue 27's generators)
    ("bnpo-mask", 1481846718571421214, 2278955225969783583): {"gradient"},
    ("cispo-mask", 3379075746491900858, 1407860267949091054): {"loss"},
    ("vllm-is-mask", 1481846718571421214, 2278955225969783583): {"gradient"},
}
EPS32 = 2.0**-23


PYTORCH = load_module(ROOT / "implementations" / "pytorch" / "impl.py", "fp32_logprob_pytorch_impl")


@functools.lru_cache(maxsize=None)
def _resolved(member: str, workload: str):
    """The member's spec and its resolved workload (both frozen), once per member: finding a spec reads
    and validates the family's JSON, a third of a sampled draw's CPU (test_sampled_false_failure_rate_...)."""
    spec = find_spec(f"grpo/{member}")
    return spec, spec.resolve(spec.workload(workload), random.Random(0))


def _run(member: str, s0: int, s1: int, workload: str = "mask-fp32", old: bool = False) -> WorkloadConformance:
    """The conformance run of a check (no worker: only its judgment is used); `old`: without the
    log-prob terms, as the judgment was before them."""
    spec, rw = _resolved(member, workload)
    run = WorkloadConformance(types.SimpleNamespace(device=torch.device("cpu")), spec, rw, [s0, s1], ())
    if old:
        run.rows.logp_error = lambda x: None
    return run


def _adversarial(run: WorkloadConformance, impl=None, upstream: float = 1.0) -> Call:
    """Call I of the adversarial probe (seed seeds[-1] ^ 0xA5A5A5A5, the adversarial profiles), made here.
    Its inputs are an input slot of `run`, as a check's probe's are: the run's reference cache
    (checks/reference_cache.py) computes their float64 log-probs once per judgment, not once per use
    (three times before: a third of a judgment's CPU; the values are the same computation's)."""
    x = gen.generate(run.spec, run.rw, run.seeds[-1] ^ 0xA5A5A5A5, "cpu",
                     profiles=run.spec.validation.adversarial_profiles, values=run.model.values).tensors
    leaf = x["logits"].detach().clone().requires_grad_(True)
    loss = (impl or PYTORCH.grpo_loss)(leaf, **{k: v for k, v in x.items() if k != "logits"}, **run.model.call_values)
    (loss * upstream).backward()
    slot = _slot(run, InputSlot("adversarial", x, x))
    return Call("I#1", slot, upstream, float(loss.detach()), {}, {"logits": {}}, {"logits": leaf.grad}, None)


def _slot(run: WorkloadConformance, slot: InputSlot) -> InputSlot:
    """`slot` as one of `run`'s input slots (a run finds its slots among its attributes, `_slot_of`)."""
    run.adversarial_slot = slot
    return slot


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one intra-op thread is faster than two on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _draws(n: int, base: int = 0):
    for i in range(n):
        r = random.Random(base + i)
        yield r.getrandbits(62), r.getrandbits(62)


# -- the bound itself -----------------------------------------------------------------------------
def test_fp32_logp_error_bounds_honest_fp32_log_softmax():
    """Four honest fp32 formulations on the adversarial rows (logits to 1e4, T down to 0.45): every
    log-prob inside the derived bound, and the bound within 5x of what fp32 reaches (not a blanket)."""
    spec = find_spec("grpo/token-offpolicy-mask")
    rw = spec.resolve(spec.workload("mask-fp32"), random.Random(0))
    worst = 0.0
    for i in range(60):
        rng = random.Random(i)
        T = rng.uniform(0.45, 2.2)
        values = dict(spec.parameter_values, temperature=T)
        x = gen.generate(spec, rw, rng.getrandbits(62), "cpu", profiles=spec.validation.adversarial_profiles,
                         values=values).tensors
        exact = reference_logprobs(x, GrpoParameters.from_spec(spec, values))
        S = x["completion_ids"].shape[1]
        z, ids = x["logits"][:, :S].float(), x["completion_ids"].long().unsqueeze(-1)
        bound = fp32_logp_error(z.reshape(-1, z.shape[-1]), T).view(exact.shape)
        for lp in (torch.log_softmax(z / T, -1).gather(-1, ids).squeeze(-1),
                   torch.log_softmax(z * (1.0 / T), -1).gather(-1, ids).squeeze(-1),
                   torch.log_softmax((z - z.amax(-1, keepdim=True)) / T, -1).gather(-1, ids).squeeze(-1),
                   (z / T).gather(-1, ids).squeeze(-1) - torch.logsumexp(z / T, -1)):
            worst = max(worst, float(((lp.double() - exact).abs() / bound).max()))
    assert 0.2 < worst < 1.0, worst  # measured 0.38 (1.9 eps (1 + M + ln V) of the bound's 5)


def test_a_dominant_early_term_is_inside_the_sum_bound():
    """Rows whose mass sits in one early column over a flat rest (reach's planted peaks): torch's CPU fp32
    log_softmax loses the rest's small terms in that term's lane, an error growing like V. The spread-mass bound
    (SUM_RESOLUTION sqrt(V)) was under it at V 139523 (the eager fused baseline failed reach's float32 vocabulary
    call, forty-fourth session); `compare.sum_error` holds it, within 4x."""
    gen64 = torch.Generator().manual_seed(3)
    worst_old = worst_new = 0.0
    for V, pos in ((139523, 0), (139523, 31), (262147, 1), (65536, 64)):
        z = torch.randn(4, V, dtype=torch.float64, generator=gen64) * 0.3
        z[:, pos] = z.amax(-1) + 16.0
        z32 = z.float()
        err = (torch.log_softmax(z32, -1).double() - torch.log_softmax(z32.double(), -1)).abs().amax(-1)
        m = z32.abs().amax(-1).double()
        old = LOGP_RESOLUTION * (1.0 + m + math.log(V)) + SUM_RESOLUTION * math.sqrt(V)
        worst_old = max(worst_old, float((err / old).max()))
        worst_new = max(worst_new, float((err / fp32_logp_error(z32, 1.0)).max()))
    assert worst_old > 1.0 and 0.25 < worst_new < 1.0, (worst_old, worst_new)  # measured 7.2 and 0.52


def test_the_fused_error_model_holds_a_dominant_early_term(monkeypatch):
    """The same lane loss through the fused operation's error model (`fused_linear.tolerance._row_errors`): float32
    rows peaking 16 over a flat row in columns 0-64 at V 139523, as reach's vocabulary call plants them. The eager
    baseline's log-probs erred ~1e-4 there and its d weight failed reach in 5 of 17 runs (forty-fourth session); the
    model's own log-softmax term alone (2 u32 (1 + max|z|/T + ln V), ~4e-6) did not hold it, `compare.sum_error`
    does."""
    from grpo_conform.ops.fused_linear import tolerance
    from grpo_conform.ops.grpo_terms import GrpoParameters as Params

    spec = find_spec("grpo-fused-linear/token-is")
    p = Params.from_spec(spec, dict(spec.parameter_values, temperature=1.0))
    gen64 = torch.Generator().manual_seed(5)
    V, H, R = 139523, 8, 4
    h = torch.randn(1, R, H, generator=gen64)
    w = torch.randn(V, H, generator=gen64) * (0.3 / math.sqrt(H))
    for r, col in enumerate((0, 1, 31, 64)):
        w[col] = 16.0 * h[0, r] / h[0, r].pow(2).sum()  # row r's logit 16 there, the rest of its row std ~0.3
    ids = torch.randint(100, V, (1, R), generator=gen64)

    def inputs():  # a fresh input set each time: the error model memoises per input set
        return {"hidden": h, "weight": w, "completion_ids": ids, "advantages": torch.ones(1)}

    z = h.reshape(R, H) @ w.T
    exact = torch.log_softmax(h.reshape(R, H).double() @ w.double().T, -1).gather(-1, ids.reshape(R, 1)).squeeze(-1)
    err = (torch.log_softmax(z, -1).gather(-1, ids.reshape(R, 1)).squeeze(-1).double() - exact).abs()
    bound = tolerance.logprob_allowance(inputs(), p).reshape(-1)
    monkeypatch.setattr(tolerance, "sum_error", lambda width, p_max: torch.zeros_like(p_max))
    without = tolerance.logprob_allowance(inputs(), p).reshape(-1)
    assert float((err / without).max()) > 1.0 and float((err / bound).max()) < 0.5, (err, without, bound)


@pytest.mark.parametrize("member", RATIO_MEMBERS)
def test_token_terms_bound_the_moves_of_the_closed_form(member):
    """Moving every logp by up to its bound (random signs, and all at +e, all at -e) moves dL/dlogp and
    each weighted per-token loss by no more than `coef_error` and `loss_error` say; the bounds are not
    vacuous (the extreme moves reach a good part of them)."""
    spec = find_spec(f"grpo/{member}")
    rw = spec.resolve(spec.workload("mask-fp32"), random.Random(0))
    reached = 0.0
    for i, profiles in itertools.product(range(4), (spec.validation.adversarial_profiles, None)):
        run = _run(member, *next(_draws(1, 100 + i)))
        x = gen.generate(spec, rw, run.seeds[1], "cpu", profiles=profiles, values=run.model.values).tensors
        p = run.model.params
        logp = reference_logprobs(x, p)
        e = run.rows.logp_error(x)
        base = token_terms(x, p, logp, e)
        g = torch.Generator().manual_seed(i)
        for sign in (torch.randint(0, 2, logp.shape, generator=g).double() * 2 - 1,
                     torch.ones_like(logp), -torch.ones_like(logp)):
            moved = token_terms(x, p, logp + sign * e)
            d_coef = (moved.dlogp - base.dlogp).abs()
            d_loss = (moved.loss - base.loss).abs()
            assert bool((d_coef <= base.coef_error * (1 + 1e-9) + 1e-300).all())
            assert bool((d_loss <= base.loss_error * (1 + 1e-9) + 1e-300).all())
            live = base.coef_error > 0
            if bool(live.any()):
                reached = max(reached, float((d_coef[live] / base.coef_error[live]).max()))
    assert reached > 0.9  # first order: the bound is what a move of e really does


def test_no_ratio_no_log_prob_term():
    """token-is (no old log-probs: the ratio is exactly 1 in any arithmetic): nothing is added."""
    run = _run("token-is", *next(_draws(1)), workload="fp32-small")
    x = gen.generate(run.spec, run.rw, 5, "cpu", profiles=run.spec.validation.adversarial_profiles,
                     values=run.model.values).tensors
    assert not needs_logprobs(x, run.model.params) and run.rows.logp_error(x) is None
    _, cmp = run.judge(_adversarial(run))
    assert cmp.passed and cmp.logp_sq == 0.0 and "frobenius_allowed_logprob" not in cmp.evidence()


def test_comparator_allows_a_row_moved_by_its_coefficient_error_and_no_more():
    """A row whose coefficient is off by its bound passes; by three times its bound (past the
    relative allowance too) it fails, elements and Frobenius."""
    tol = find_spec("grpo/bnpo-mask").tolerance("float32").gradient
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 50, generator=g, dtype=torch.float64) * 3
    q = -torch.softmax(z, -1)
    q[:, 3] += 1.0
    coef = torch.tensor([0.7, -0.2], dtype=torch.float64)
    expected = coef[:, None] * q
    scale = coef.abs()
    moved = torch.tensor([0.02, 0.02], dtype=torch.float64) * scale  # 2%: above element_rtol and Frobenius

    def run(factor, with_logp=True):
        cmp = GradientComparator(tol, 3, 50)  # rows 0, 1 scored, row 2 would be the last position
        actual = expected * (1 + factor * moved / scale)[:, None]
        cmp.update(0, actual, expected, scale, logp=(coef, moved) if with_logp else None)
        return cmp

    assert run(1.0).passed and run(1.0).evidence()["frobenius_allowed_logprob"] > 0
    assert not run(1.0, with_logp=False).passed
    assert not run(3.0).passed and run(3.0).mismatches > 0 and not run(3.0).frobenius_ok


# -- the judgment on the adversarial probe ------------------------------------------------------------
def test_pinned_seeds_pass_now_and_failed_without_the_log_prob_terms():
    for (member, s0, s1), failed in PINNED.items():
        before = _run(member, s0, s1, old=True)
        loss_cmp, cmp = before.judge(_adversarial(before))
        assert {n for n, ok in (("loss", loss_cmp.passed), ("gradient", cmp.passed)) if not ok} == failed
        now = _run(member, s0, s1)
        loss_cmp, cmp = now.judge(_adversarial(now))
        assert loss_cmp.passed and cmp.passed, (member, describe_outputs(loss_cmp, cmp))


@pytest.mark.slow  # ~30 s CPU: 1,200 sampled draws judged, ~500 of them also without the terms
def test_sampled_false_failure_rate_of_honest_fp32(capsys):
    """implementations/pytorch on the adversarial probe of mask-fp32, seeds drawn as Random(i) gives
    them: no false failure now; before the log-prob terms these same draws failed (measured over 1000
    draws per member: gradient 0.6-1.1% for every token-level ratio member, CISPO's loss 2.7%).

    What the draws bound: 0 false failures in 1,200 draws puts the rate under 0.25% (95%: 3/1200) over
    the four members, under 0.75% for a member of 400 draws and 1.5% for one of 200; the old judgment's
    0.6-2.7% is what this guards against. The old judgment only has to show that the draws reach the
    flake: >= 10 of them fail it, and (since 2026-12-03) every member's at least once, the gradient's
    as well as CISPO's loss. It stops once both are settled: a member's draws are judged the old way
    until its first failure, CISPO's (first, the member that fails it most) until the 10th in all
    (all 1,200 draws judged both ways found 4, 16, 3, 3: bnpo, cispo, delta, vllm-is). Every draw is
    still judged now."""
    counts = {}
    enough = 10
    for member, n in (("cispo-mask", 400), ("bnpo-mask", 400), ("token-offpolicy-mask-delta", 200),
                      ("vllm-is-mask", 200)):
        now = before = old_judged = 0
        for s0, s1 in _draws(n):
            run = _run(member, s0, s1)
            call = _adversarial(run)
            loss_cmp, cmp = run.judge(call)
            now += not (loss_cmp.passed and cmp.passed)
            if before == 0 or sum(c[1] for c in counts.values()) + before < enough:
                old = _run(member, s0, s1, old=True)
                loss_cmp, cmp = old.judge(call, _slot(old, call.slot))
                before += not (loss_cmp.passed and cmp.passed)
                old_judged += 1
        counts[member] = (n, before, now, old_judged)
    with capsys.disabled():
        print("\n  false failures (draws, before, now, draws judged before):", counts)
    assert all(now == 0 for _, _, now, _ in counts.values()), counts
    assert all(before > 0 for _, before, _, _ in counts.values()), counts  # each member's draws reach it
    assert sum(before for _, before, _, _ in counts.values()) >= enough, counts  # the draws do exercise the flake


@pytest.mark.parametrize("folder,member", [
    ("clip-ignored", "token-offpolicy-mask"), ("mask-ignored", "token-offpolicy-mask"),
    ("bnpo-as-grpo", "bnpo-mask"), ("kl-k1", "token-offpolicy-mask-kl"),
    ("kl-beta-ignored", "token-offpolicy-mask-kl"), ("sequence-ratio-per-token", "sequence-offpolicy-mask"),
    ("is-correction-ignored", "vllm-is-mask"), ("micro-batch-normaliser", "dapo-global-mask"),
    ("dispatched-to-grpo", "cispo-mask"),
])
def test_wrong_members_still_fail_where_the_allowance_is_widest(folder, member):
    """The gallery's wrong members, judged on the adversarial probe (logits to 1e4, where the log-prob
    term is largest): every draw fails."""
    impl = load_module(ROOT / "tests" / "gallery" / folder / "impl.py", f"fp32_logprob_{folder.replace('-', '_')}")
    for s0, s1 in _draws(12, 7000):
        run = _run(member, s0, s1)
        loss_cmp, cmp = run.judge(_adversarial(run, impl.grpo_loss))
        assert not (loss_cmp.passed and cmp.passed), (folder, s0, s1)


def test_forward_only_gets_the_loss_allowance_of_judge():
    (member, s0, s1) = next(k for k, v in PINNED.items() if v == {"loss"})
    run = _run(member, s0, s1)
    call = _adversarial(run)
    loss_cmp, _ = run.judge(call)
    floor = run.loss_floor(call.slot.pristine)
    assert loss_cmp.allowed == pytest.approx(max(run.tol.loss.allowed(loss_cmp.expected), floor), rel=1e-9)
    assert floor > run.tol.loss.allowed(loss_cmp.expected)  # this draw's loss needs the floor


# -- messages --------------------------------------------------------------------------------------
def test_a_failed_loss_is_named_in_the_message():
    """When only the loss fails, the message says so (it used to read 'all elements within tolerance')."""
    (member, s0, s1) = next(k for k, v in PINNED.items() if v == {"loss"})
    run = _run(member, s0, s1, old=True)
    J.adversarial(run, _adversarial(run), run.spec.validation.adversarial_profiles)
    (outcome,) = [o for o in run.book.outcomes() if o.check == "adversarial-inputs"]
    assert outcome.failed
    assert outcome.message.split(": ", 1)[1].startswith("loss ") and "gradient within tolerance" in outcome.message
    assert "all elements within tolerance" not in outcome.message

    tol = find_spec("grpo/bnpo-mask").tolerance("float32")
    grad = GradientComparator(tol.gradient, 2, 4)
    e = torch.tensor([[0.5, -0.25, -0.25, 0.0]], dtype=torch.float64)
    grad.update(0, e * 1.5, e, torch.tensor([0.5], dtype=torch.float64))
    bad_loss, good_loss = LossComparison(1.1, 1.0, 1e-3), LossComparison(1.0, 1.0, 1e-3)
    both = describe_outputs(bad_loss, grad)
    assert both.startswith("loss 1.1 vs 1") and "gradient: " in both and "outside tolerance" in both
    assert describe_outputs(good_loss, grad) == grad.describe()


# -- the real check ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_pinned_seeds_pass_through_run_check(monkeypatch):
    """implementations/pytorch through run_check (worker process, every probe of mask-fp32) with the
    workload seeds pinned to the cases that failed before."""
    import grpo_conform.check as C
    from grpo_conform.check import CheckRequest, run_check

    pins = list(PINNED)
    by_run = [tuple(pins[:2]), tuple(pins[2:])]
    for cases in by_run:
        seeds = iter([s for _, s0, s1 in cases for s in (s0, s1)])
        monkeypatch.setattr(C, "fresh_seed", lambda: next(seeds))
        report = run_check(CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                                        workloads=("mask-fp32",), members=tuple(m for m, _, _ in cases),
                                        timing=False))
        (impl,) = report.implementations
        assert [tuple(w.seeds) for w in impl.workloads] == [(s0, s1) for _, s0, s1 in cases]
        failed = [(w.name, o.check, o.message) for w in impl.workloads for o in w.outcomes if o.failed]
        assert not failed, failed
        assert impl.status == "conformant"


def test_the_bound_holds_for_spread_rows_past_10_5_columns():
    """Reach's vocabulary-blocks calls draw 'normal' rows of 131072-262144 columns, their mass spread over all of
    them: there torch's own fp32 log_softmax erred by up to 2.8x the derived part of the bound on this project's
    machine (its CPU's summation order; another CPU's differs), and the honest pytorch baseline failed a vespo-mask
    loss in clean-clone CI run 230. The bound's measured sqrt(V) term (at most 0.77 of it used there) covers it."""
    from grpo_conform.compare import fp32_logp_error

    g = torch.Generator().manual_seed(1)
    for vocab, temperature in ((262144, 0.58), (278527, 1.0), (139521, 1.0)):
        z = (torch.randn(16, vocab, generator=g, dtype=torch.float64) * 3.0).to(torch.bfloat16)
        t = torch.randint(0, vocab, (16,), generator=g)
        want = torch.log_softmax(z.double() / temperature, -1).gather(-1, t[:, None])[:, 0]
        got = torch.log_softmax(z.float() / temperature, -1).gather(-1, t[:, None])[:, 0].double()
        assert bool(((got - want).abs() <= fp32_logp_error(z, temperature)).all()), (vocab, temperature)
