"""The compile-ahead worker's inputs (check_ahead.py): a workload's proxy, its shape with the batch axis at 1 or
as it is, filled without a full-size draw, and the distinct proxies of a member's workloads and calls."""

from __future__ import annotations

import random

from grpo_conform.ops import operation_for

PROXY_AXIS = "batch"


def proxy_workload(spec, workload, full: bool = False):
    """The workload resolved with its batch axis at 1, or at its own shapes (`full`); other ranges drawn as a
    fixed seed draws them."""
    axes = dict(workload.axes)
    if PROXY_AXIS in axes and not full:
        axes[PROXY_AXIS] = 1
    return spec.resolve(workload.model_copy(update={"axes": axes}), random.Random(0))


def fill_proxy(spec, rw, seed: int, device, out: dict) -> None:
    """A proxy's inputs written into `out`. At the workloads' own shapes a set is drawn with the batch axis at 1 and
    repeated along it: drawing full-size sets cost the slots 16.4 s summed on the H200 (seventeenth session), while
    what a proxy steers, the kernels its calls compile, follows from the shapes and dtypes. Drawn whole where there is
    no batch axis above 1, or an axis derived from it."""
    op = operation_for(spec)
    batch = rw.axes.get(PROXY_AXIS, 1)
    derived = any(a.derivation() is not None and a.derivation()[0] == PROXY_AXIS for a in spec.axes)
    if batch <= 1 or derived:
        op.generate(spec, rw, seed, device, out=out)
        return
    axes = {a.name: rw.axes[a.name] for a in spec.axes if a.derivation() is None}
    one = spec.resolve(rw.workload.model_copy(update={"axes": dict(axes, **{PROXY_AXIS: 1})}))
    small = op.generate(spec, one, seed, device).tensors
    for name, t in out.items():
        dims = [i for i, a in enumerate(spec.input(name).shape) if a == PROXY_AXIS]
        if not dims:
            t.copy_(small[name])
        elif len(dims) == 1:
            for b in range(batch):  # one batch row at a time: no full-size temporary
                t.narrow(dims[0], b, 1).copy_(small[name])
        else:
            t.copy_(small[name].repeat(*(batch if i in dims else 1 for i in range(t.dim()))))


def _key(rw) -> tuple:
    return tuple(sorted(rw.shapes.items())), tuple(sorted(rw.dtypes.items()))


def distinct(spec, workloads, full: bool, seen: set | None = None) -> list:
    """One proxy a distinct shape and dtype set, in the workloads' order (at batch 1, seed-b2..b16 are one), none
    of those in `seen` (which it extends)."""
    proxies, seen = [], set() if seen is None else seen
    for w in workloads:
        rw = proxy_workload(spec, w, full)
        if _key(rw) not in seen:
            seen.add(_key(rw))
            proxies.append(rw)
    return proxies
