"""Several graphs alive at once (the `interleaved` probe, call X): micro-batches of a pipeline, gradient
checkpointing's recomputation, a trainer that builds every micro-batch's graph before one backward. Each graph is
an ordinary call on its own input set, so state an implementation keeps between calls instead of in the graph
(`ctx`) shows as a wrong gradient of another graph."""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpo_conform import device_memory
from grpo_conform.checks import judging as J
from grpo_conform.checks.buffers import InputSlot
from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.checks.patterns import exercised


def _finish(run: WorkloadConformance, label: str, slot: InputSlot, c: float, skipped: dict[str, str],
            check: str, how: str) -> None:
    exported = run.export(label, run.out1, (check,))
    if exported is None:
        return
    report = exported["report"]
    call = Call(label, slot, c, float(run.out1.loss[0]), report.get("loss"), report.get("grads") or {}, run.out1.grads,
                skipped.get(label), exported["kept"])
    run.aliasing(label, report)
    J.finite(run, call)
    J.versus_reference(run, check, call, how)


#: graphs in flight per round of `interleaved`, drawn per run: the sum round in SUM_GRAPHS, the ordered round in
#: ORDER_GRAPHS. Two at most let state kept in a ring of two buffers per shape pass (the adversarial round's
#: `saved-lse-ring-of-two`); a ring of k is caught by a round of more than k graphs, and k is not known to the
#: implementation (the counts come from the run's secret seed), so a ring big enough to pass costs it
#: ORDER_GRAPHS[1] saved states per shape, on every call of a real run too.
SUM_GRAPHS = (2, 3)
ORDER_GRAPHS = (3, 5)  # the graphs past P and Q are the lazy sets X3-X5 (conformance.LAZY_SLOTS)
#: of the device's free memory (CUDA; the CPU: of 1 GiB), what a round's input sets beyond P and Q may take, each
#: counted with its pristine copy and twice its gradients (the worker's, and what the implementation saves)
GRAPHS_MEMORY_FRACTION = 0.25


@dataclass(frozen=True)
class Round:
    name: str  # "sum" or "order": the calls' labels X-<name>-<input set>
    drawn: int  # the graphs drawn for it
    graphs: int  # the graphs it holds in flight: `drawn`, fewer where memory is short
    scaled: int  # the graph whose upstream is c (the others' is 1)
    groups: tuple[tuple[int, ...], ...]  # the backwards in order, each of the graphs backpropagated together


def plan(seed: int, room: int) -> tuple[Round, ...]:
    """The rounds of a workload, drawn from `seed` alone (the run's: secret, recorded), each with at most 2 + `room`
    graphs: `sum`, SUM_GRAPHS graphs then one backward of them all; `order`, ORDER_GRAPHS graphs then backwards in
    a drawn permutation, consecutive graphs of it in drawn groups of one or two (any order: not only the reverse or
    the forward one, which a kernel could assume)."""
    r = random.Random(seed)
    rounds = []
    for name, counts in (("sum", SUM_GRAPHS), ("order", ORDER_GRAPHS)):
        drawn = r.randint(*counts)
        n = min(drawn, 2 + room)  # bounded by memory (large GPU workloads), never below the two P and Q give
        scaled = r.randrange(n)
        order = r.sample(range(n), n)
        groups, i = [], 0
        while i < n:
            size = 1 if i == n - 1 else r.randint(1, 2)
            groups.append(tuple(order[i:i + size]))
            i += size
        rounds.append(Round(name, drawn, n, scaled, (tuple(range(n)),) if name == "sum" else tuple(groups)))
    return tuple(rounds)


def interleaved(run: WorkloadConformance, c: float) -> None:
    """Rounds of several graphs in flight, each on its own input set (values and addresses): all forwards, then
    backward of their weighted sum (`sum`); all forwards, then backwards in a drawn order and grouping (`order`;
    `plan`), recorded in draws["interleaved"]. Each gradient must match the reference of its own inputs. A hostile
    kernel cannot tell the rounds from a pipeline's micro-batches: every graph is an ordinary call on fresh drawn
    inputs, and how many are in flight shows only once its forward has returned."""
    checks = ("interleaved-graphs", "no-mutation")
    room = _graph_room(run)
    seeds = (run.seeds[0] ^ 0x0F0F0F0F, run.seeds[1 % len(run.seeds)] ^ 0x70707070)
    exercised(run, "two-graphs")
    run.draws["interleaved_upstream"] = c
    record = run.draws["interleaved"] = {"room": room}
    for round_ in plan(run.seeds[0] ^ 0x6A4F1E2D, room):  # its own stream: the later probes keep their draws
        record[round_.name] = {"drawn": round_.drawn, "graphs": round_.graphs, "scaled": round_.scaled,
                               "groups": [list(g) for g in round_.groups]}
        if round_.graphs > 2:
            exercised(run, "more-graphs")
        extra = [f"X{k + 1}" for k in range(2, round_.graphs)]
        slots = [run.P, run.Q] + [getattr(run, name) for name in extra]  # made on first use (conformance.py)
        try:
            if not _round(run, round_, slots, c, seeds, checks):
                return
        finally:
            for name in extra:
                run.release(name)


def _round(run: WorkloadConformance, round_: Round, slots: list[InputSlot], c: float, seeds: tuple[int, int],
           checks: tuple[str, ...]) -> bool:
    """One round: every slot drawn afresh, one forward each, the backwards group by group, then each graph judged.
    False where a call failed (recorded): the probe stops."""
    for k, slot in enumerate(slots):
        run.generate(slot, seeds[k % 2] ^ len(round_.name) ^ (0x1357 * (k // 2)))
    labels = [run._label(f"X-{round_.name}-{slot.name}") for slot in slots]
    ups = [c if k == round_.scaled else 1.0 for k in range(len(slots))]
    fwd = []
    for label, slot in zip(labels, slots):
        f = run.forward(label, slot, checks)
        if f is None:
            return False
        fwd.append(f)
    skipped: dict[str, str] = {}
    for group in round_.groups:
        part = run.backward([labels[k] for k in group], [ups[k] for k in group], checks)
        if part is None:
            return False
        skipped.update(part)
    n = len(slots)
    how = (f"{n} graphs, backward of their sum, graph {round_.scaled + 1} scaled by {c:g}" if round_.name == "sum" else
           f"{n} graphs, backwards in the order " + " ".join("+".join(str(k + 1) for k in g) for g in round_.groups))
    for label, slot, f, u in zip(labels, slots, fwd, ups):
        run.book.record("runs", label, True, "every call returned")
        run.mutation(label, slot, {"forward": f["forward"], "backward": slot.changes()})
        _finish(run, label, slot, u, skipped, checks[0], how)
    return True


def _graph_room(run: WorkloadConformance) -> int:
    """How many input sets beyond P and Q a round may add: at a batch-8 GPU workload an input set is gigabytes,
    and each graph in flight also holds its gradients in the worker and whatever the implementation saves."""
    set_bytes, grad_bytes = device_memory.set_and_gradient_bytes(run.spec, run.rw)
    per_graph = 2 * set_bytes + 2 * grad_bytes
    free = device_memory.free_bytes(run.device) if run.device.type == "cuda" else 2**30
    return int(GRAPHS_MEMORY_FRACTION * free // max(1, per_graph))
