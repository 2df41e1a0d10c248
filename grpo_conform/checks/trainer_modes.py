"""Three probes of states a trainer's process is in when it calls the loss, which the generic calls (fresh leaves
without .grad, torch's default flags) never showed (red-team round of the thirty-sixth session):

- `prefilled-grad` (GP, check `grad-accumulation`): every .grad already holds a value BEFORE the forward, as a
  trainer's earlier micro-batch leaves the lm_head's weight.grad. `accumulation` (GA) and `tied` pre-fill only
  before backward, so a kernel that, finding weight.grad at forward, formed d weight there at upstream 1 and added
  it in place (losing the micro-batch's 1/k) passed every run (gallery fused-grad-accumulated-in-forward).
- `deterministic-mode` (DM, checks `loss`, `gradient`, ...): one call under
  torch.use_deterministic_algorithms(True, warn_only=True), as transformers' `full_determinism` sets it; a kernel
  with a path of its own there (index_add_ has no deterministic CUDA kernel) was never called on it, since the
  validator only checked the flags are left as found (gallery fused-deterministic-onehot-index-put).
- `autocast` (AC: `loss`, `gradient`, `contract`, ...; AC-near: `near-ties`): calls whose forward runs under
  torch.autocast, as every bf16 mixed-precision training step runs the loss; no call ever did, so a kernel casting
  its float32 inputs to the autocast dtype there passed (gallery autocast-casts-fp32-inputs).

All three apply to every operation and run once per workload.
"""

from __future__ import annotations

import dataclasses

from grpo_conform.checks import judging as J
from grpo_conform.checks import patterns
from grpo_conform.checks.conformance import CALL, PLAIN, Probe, WorkloadConformance
from grpo_conform.dtypes import torch_dtype
from grpo_conform.ops.grpo_logits.generators.near_ties import near_tie_reason
from grpo_conform.ops.grpo_logits.generators.token_ids import repeated_given
from grpo_conform.ops.grpo_views import audible_scalars

ACCUMULATION = "grad-accumulation"
NEAR_TIES = "near-ties"  # AC-near's check (the near-ties probe's own calls feed it too)
FRACTIONS = (2, 3, 4, 8, 16)  # c2 = 1/k: far from 1, so a gradient formed at upstream 1 is >= 29% off


def prefilled(run: WorkloadConformance) -> None:
    """GP: every parameter's .grad (the lm_head's weight and bias; every input's where no parameter is
    differentiated, as grpo-logits) holds c1 x its reference gradient, rounded to its dtype, before the forward; backward with c2 = 1/k; each .grad must
    end at (c1 + c2) x the reference. Activations (hidden) hold one too in a drawn half of the workloads, else
    none (their gradient then c2 x the reference).

    How a hostile kernel could tell this call from a trainer's second micro-batch: the pre-filled .grad is
    proportional to this batch's own gradient (a trainer's holds other batches'); seeing that costs it a second
    backward in the forward. With hidden's .grad absent in half the workloads, "hidden.grad is set" is no tell."""
    checks = (ACCUMULATION, "finite", "no-mutation", "no-aliasing")
    run.generate(run.P, run.seeds[1 % len(run.seeds)] ^ 0x6AF111)
    c2 = 1.0 / run.rng.choice(FRACTIONS)
    c1 = float(f"{c2 * run.rng.uniform(1.8, 2.4):.6g}")  # as GA: c1 + c2 keeps bf16's relative precision
    names = [g.input for g in run.spec.gradients]
    params = [n for n in names if len(run.spec.input(n).shape) < 3]
    filled = names if not params or run.rng.random() < 0.5 else params
    out = run.out2  # the prefill: the worker copies each buffer into a leaf's .grad before the forward
    for name, chunks in run.op.reference_gradients(run.spec, run.P.pristine, run.model.params).items():
        if name not in filled:
            continue
        buf = out.grads[name]
        buf.zero_()
        width = run.groupings[name].width(run.rw)
        flat = buf.view(-1, width)
        for ch in chunks:
            flat[ch.start : ch.stop] = (ch.values.reshape(-1, width) * c1).to(buf.device, buf.dtype)
    run.exported.pop(out.name, None)  # O2 now holds the prefill, no call's outputs
    run.draws["prefilled_grad"] = {"upstream": [c1, c2], "filled": list(filled)}
    patterns.exercised(run, "grad-prefilled-before-forward")
    call = run.call("GP", run.P, run.out1, checks, upstream=c2, prefill={"outputs": out.name, "inputs": filled})
    if call is None:
        return
    J.finite(run, call)
    held = dataclasses.replace(call, upstream=c1 + c2, grads={n: g for n, g in call.grads.items() if n in filled})
    J.versus_reference(run, ACCUMULATION, held, f"{', '.join(filled)} .grad held {c1:g} x the gradient before the "
                                               f"forward; backward {c2:g}: accumulated {c1 + c2:g} x")
    rest = {n: g for n, g in call.grads.items() if n not in filled}
    if rest:
        J.versus_reference(run, ACCUMULATION, dataclasses.replace(call, grads=rest),
                           f"{', '.join(rest)} without .grad beside pre-filled {', '.join(filled)}; backward {c2:g}")


def deterministic_mode(run: WorkloadConformance) -> None:
    """DM, DM-2: two calls with torch.use_deterministic_algorithms(True, warn_only=True) set around its forward and
    backward (the worker's `deterministic`; the previous setting put back, the global-state tripwire not told).

    How a hostile kernel could tell it from a trainer's: warn_only (torch.is_deterministic_algorithms_warn_only_
    enabled()) is True here, False under transformers' full_determinism; strict mode would fail an honest kernel
    that uses an op without a deterministic implementation, so that tell stays; so does torch._inductor.config.
    deterministic, set only where already imported (global_state.deterministic_algorithms). The ids repeat
    (`token_ids.repeated_given`: each ~4 times), so a deterministic path that scatters per id shows; a tiny
    workload's uniform ids (16 of 257) repeated on a kept token in about a third of the sets. A kernel could key
    on that repetition too, as on any statistic of one call's inputs."""
    # two calls on fresh sets: at a tiny workload one set's repeated ids missed the gallery's case in ~1 run of 4
    run.draws["deterministic_mode"] = {"distinct_ids": []}
    patterns.exercised(run, "deterministic-algorithms")
    for i, label in enumerate(("DM", "DM-2")):
        given = repeated_given(run.spec, run.rw, run.rng.getrandbits(62))
        run.draws["deterministic_mode"]["distinct_ids"] += [int(t.unique().numel()) for t in given.values()]
        run.generate(run.P, run.seeds[0] ^ 0xDE7E ^ (i << 20), given=given)
        call = run.call(label, run.P, run.out1, PLAIN, deterministic=True)
        if call is None:
            return
        J.plain(run, call)


#: the dtypes torch.autocast lowers to; on the CPU bfloat16 (CPU training's autocast), on CUDA the lead input's own
#: where it is one of these (the dtype its model runs in), else bfloat16
AUTOCAST_DTYPES = ("bfloat16", "float16")


def autocast_dtype(run: WorkloadConformance) -> str:
    """The autocast dtype of the workload's calls (AUTOCAST_DTYPES)."""
    return run.grad_dtype if run.device.type == "cuda" and run.grad_dtype in AUTOCAST_DTYPES else "bfloat16"


def lowered_operands(run: WorkloadConformance, dtype: str) -> list[str]:
    """The inputs of the operation's matrix products held in a dtype other than `dtype`: autocast runs torch's
    matmul of those in `dtype`, which is the caller's instruction (autocast exists to lower the precision of
    matrix products), so a call there has no float32 reference to meet. Empty for an operation without a product (grpo-logits)."""
    names = {n for g in run.op.gemms(run.spec, run.rw, "full") for n in g.operands if n}
    # any other dtype: autocast also recasts float16 operands to bfloat16 (one more rounding, 3 fewer mantissa bits)
    return sorted(n for n in names if n in run.P.tensors and run.P.tensors[n].dtype != torch_dtype(dtype))


def autocast(run: WorkloadConformance) -> None:
    """AC: a call whose forward runs under torch.autocast(<device>, dtype) (`autocast_dtype`; the backward outside
    it, as PyTorch's AMP recipe runs a step) on a fresh drawn set, its per-sequence scalars `audible_scalars` (the
    pattern's one plain call: a tiny or zero scalar on the single-token row hid it); AC-near: the same on
    near-ties' set (every live ratio a hair from its clip bound: `Operation.near_tie_inputs`), where a member has a
    hard clip bound, judged under `near-ties` as that check's own calls are (its folders' flipped branches are near
    ties). Autocast
    changes no declared input: every input (the float32 ones too) stays as given, so both are judged
    against the float64 reference at the inputs' dtypes' tolerance, and the loss stays the declared float32/float64
    (`contract`; every honest bundled implementation returns float32 there). An input cast to the autocast dtype
    moves a log-ratio by up to 2^-9 |old log-prob|, which flips AC-near's branches (autocast-casts-fp32-inputs).

    On the fused operation the call runs only where the GEMM's operands (hidden, weight) are already in the
    autocast dtype: with other operands autocast recasts torch's matmul by the caller's instruction
    (`lowered_operands`), recorded as skipped in the draws. The other-dtypes pass makes the call too (since the
    forty-second session: a float32 lead input cast to bfloat16 under autocast passed every default run), so an
    operation without a product meets autocast with its lead input in float16 and float32.
    How a hostile kernel could tell it apart: torch.is_autocast_enabled() is true, which is the point of the call,
    and a kernel keyed on that, right here, is right under every autocast a trainer uses at this dtype. Left: a
    kernel wrong only under float16 autocast on the CPU, or under an autocast dtype other than the lead input's
    on CUDA, or wrong only in a backward run inside the autocast block (the recipe runs it outside)."""
    dtype = autocast_dtype(run)
    lowered = lowered_operands(run, dtype)
    run.draws["autocast"] = {"dtype": dtype, "calls": []}
    if lowered:
        run.draws["autocast"]["skipped"] = f"{', '.join(lowered)} wider than {dtype}: autocast lowers the product"
        return
    patterns.exercised(run, "autocast")
    near = near_tie_reason(run.model.params, {t.name for t in run.spec.inputs}) is None
    for i, label in enumerate(("AC", "AC-near") if near else ("AC",)):
        seed = run.seeds[0] ^ 0xA17C ^ (i << 24)
        run.generate(run.P, seed)
        run.P.write(audible_scalars(run, run.P))  # the pattern's one plain call: every row with tokens audible
        if label == "AC-near":
            run.P.write(run.op.near_tie_inputs(run.spec, run.P.pristine, run.model.params, seed, {}))
        near_call = label == "AC-near"  # judged as near-ties' calls are: a branch flipped there is a near tie missed
        feeds = (NEAR_TIES, "finite", "no-mutation", "no-aliasing") if near_call else PLAIN
        call = run.call(label, run.P, run.out1, feeds, autocast=dtype)
        if call is None:
            return
        run.draws["autocast"]["calls"].append(label)
        if near_call:
            J.finite(run, call)
            J.versus_reference(run, NEAR_TIES, call, "under torch.autocast, every ratio a hair from its clip bound")
        else:
            J.plain(run, call)


TRAINER_MODES = (
    Probe("prefilled-grad", prefilled.__doc__, prefilled, CALL + (ACCUMULATION, "finite"), (ACCUMULATION,)),
    Probe("deterministic-mode", deterministic_mode.__doc__, deterministic_mode, PLAIN + CALL),
    Probe("autocast", autocast.__doc__, autocast, PLAIN + CALL + (NEAR_TIES,)),
)
