"""The `rewritten-inputs` probe: inputs written over in place between a call's forward and its backward.

The caller's side of the contract (docs/checks.md, `rewritten-inputs`): a caller must not rewrite an input between
the forward and the backward of a call, and an implementation must, if one does, either give the gradient of the
forward's inputs or raise. That is what autograd gives any implementation built on it: a tensor kept with
`ctx.save_for_backward` (or saved by a torch op) carries its version, and backward raises "modified by an inplace
operation" when it moved; a value copied out at forward is simply the forward's. What it rules out is the silent
third outcome: a backward that recomputes from inputs kept by reference (`ctx.others = inputs`, a closure, a
module attribute), outside the version check, and so differentiates the new values. A trainer that refills static
input buffers (CUDA graphs, a prefetching data loader) for the next micro-batch while this one's backward is
pending gets a gradient of a batch that never ran (thirty-sixth session's red-team case
`recompute-reads-inputs-at-backward`).

One call per input the member declares, that input alone rewritten (with several at once, a saved logits tensor
raises and hides advantages read by reference), to the values of a second input set drawn at the same workload
(different advantages, ids, mask, log-probs: the gradient of the rewritten batch differs from the forward's). The
rewrite runs in the worker (op `rewrite`), in place under torch.no_grad on the tensor the implementation was handed,
so autograd counts it; the shared buffer is put back before judging. Once per worker process and member, in its
first workload, as `reach`: what it looks for is a property of the code.

How a hostile implementation passes it while wrong: by raising for every rewrite (allowed: an error is the
contract's other outcome, never a wrong number), or by telling this call from a trainer's: the rewrite is exactly a
second drawn input set of the same workload, and it comes in the worker between two requests; an implementation
that compares its inputs' data at backward with a copy it kept could tell any rewrite, and would then be honest.
A backward that reads an input by reference only at some shapes or dtypes passes: the calls run at the member's
first workload only.
"""

from __future__ import annotations

from typing import Any

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.isolation.session import WorkerFailure

CHECK = "rewritten-inputs"
SEED = 0x5E3A1E  # the forward's set (XOR the workload's seed); the rewritten values: the same XOR 1


def rewritten_inputs(run: WorkloadConformance) -> None:
    """RW-<input>: for each input the member declares, a call whose input is written over in place, between
    forward and backward, with a second input set's values; its gradient must be the forward's inputs' reference
    gradient, or backward must raise."""
    made_in = run.made_in(CHECK)
    if made_in is not None:
        run.book.not_applicable(CHECK, f"made once per worker process: its calls ran in workload {made_in}")
        return
    run.generate(run.P, run.seeds[0] ^ SEED)
    run.generate(run.Q, run.seeds[0] ^ SEED ^ 1)
    outcomes: dict[str, str] = {}
    run.draws["rewritten_inputs"] = outcomes
    try:
        for i, name in enumerate(t.name for t in run.spec.inputs):
            outcome = _rewritten(run, name, "autograd.grad" if i % 2 else "backward")
            if outcome is None:
                return
            outcomes[name] = outcome
    finally:
        run.P.restore()


def _rewritten(run: WorkloadConformance, name: str, method: str) -> str | None:
    """One call with `name` rewritten: "raised", "matched", "wrong"; None where the worker failed otherwise (that
    failure recorded against the check)."""
    checks = (CHECK,)
    label = run._label(f"RW-{name}")
    f = run.forward(label, run.P, checks)
    if f is None:
        return None
    run.mutation(label, run.P, {"forward": f["forward"]})
    if run.ask(checks, label, op="rewrite", call=label, source=run.Q.name, names=[name]) is None:
        return None
    out = run.out1
    out.clear()
    try:
        reply = run.session.request(op="backward", calls=[label], upstream=[1.0], method=method,
                                    export={"call": label, "outputs": out.name, "keep": False})
    except WorkerFailure as failure:
        run.P.restore()
        if failure.kind == "exception" and (failure.error or {}).get("phase") == "backward":
            run.book.record(CHECK, label, True, f"call {label} ({name} rewritten after forward): backward raised "
                            f"{(failure.error or {}).get('type')}", {"raised": failure.evidence()})
            return "raised"
        run._fail(checks, label, failure)
        return None
    run.P.restore()  # judged against the forward's inputs, as the shared buffers held them
    run.book.record("runs", label, True, "every call returned")
    exported = run._exported(label, out, False, reply.get("report") or {})
    report: dict[str, Any] = exported["report"]
    skipped = (reply.get("skipped") or {}).get(label)
    call = Call(label, run.P, 1.0, float(out.loss[0]), report.get("loss"), report.get("grads") or {}, out.grads,
                skipped)
    before = len(run.book.findings[CHECK])
    J.versus_reference(run, CHECK, call, f"{name} rewritten in place after forward: the forward's inputs' gradient, "
                                         "or an error")
    return "matched" if all(f.status == "pass" for f in run.book.findings[CHECK][before:]) else "wrong"
