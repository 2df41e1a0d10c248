"""How grpo-logits' one gradient is judged (issue 30): d loss / d logits row by row, each row (one
(sequence, position), the vocabulary along it) against the float64 reference with allowances derived
from the given logits themselves: fp32's log-sum-exp floors (`compare.fp32_floor`, `fp32_target_floor`),
the bound of an fp32 log-prob error through the ratio (`compare.fp32_logp_error`), the rows' zero sums and
the left-over last position. An operation with its own error model (grpo-fused-linear) never gets here:
the engine judges it unit by unit (`checks/units.py`).

`RowJudge` is the engine's (`checks/conformance.WorkloadConformance`) logits path, moved unchanged out of
the engine: the engine makes one per workload through `Operation.row_judge` and asks it only where
`Operation.error_model` gives None. It reads the run's drawn parameters, tolerances and reference cache
(`run.model`, `run.tol`, `run.refs`) and never calls the worker. `recheck_gradient` is the same judgment
for a timed call's re-check (`checks/timed.py`), at the declared defaults and without the log-prob terms.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_conform.compare import (FP32_RESOLUTION, GradientComparator, compare_loss, fp32_floor, fp32_logp_error,
                                  fp32_target_floor, fused_comparison, target_floor_from_logp)
from grpo_conform.formed_rows import FormedRows
from grpo_conform.ops.grpo_logits.reference import (chunked_gradient, kernel_reference, reference_logprobs,
                                                    rows_per_chunk)
from grpo_conform.ops.grpo_terms import needs_logprobs, token_terms
from grpo_conform.phases import PHASES


#: Why the d logits row checks (`gradient-row-sums`, `last-row-zero`) are not applicable to an operation
#: without a left-over last position (the engine prefixes the operation's name).
NO_ROWS = "no logits are given, so no d logits rows (their zero sums and a left-over last position) to check"


class RowJudge:
    """The judgment of d logits rows for one workload's conformance run (`run`: the engine)."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def _row_floors(self, x, chunk, z, targets):
        """(max|z|/T, min(1 - p_t, V 2^-24)) of the chunk's rows: `fp32_floor` and
        `fp32_target_floor` without their scale, computed once per pristine content."""
        run = self.run
        slot = run._slot_of(x)
        entry = None if slot is None else run.refs.entry(run.slot_key(slot), run.model.values)
        key = (chunk.start, chunk.stop)  # chunk sizes follow free device memory: they can differ between calls
        if entry is not None and key in entry.rows:
            return entry.rows[key]
        T = run.model.temperature
        # in pieces within the float64 budget: a chunk without values (the fused path) spans up to
        # FORMED_CHUNK_ROWS rows, and fp32_target_floor holds a few float64 copies of its rows
        step = rows_per_chunk(run.width, device=run.device)
        ms, rests = [], []
        with PHASES("reference"):
            for lo in range(chunk.start, chunk.stop, step):
                zc, tc = z[lo : min(lo + step, chunk.stop)], targets[lo : min(lo + step, chunk.stop)]
                mc, rc = row_floor_parts(zc, tc, T, kernel_reference(zc))
                ms.append(mc)
                rests.append(rc)
            m, rest = (ms[0], rests[0]) if len(ms) == 1 else (torch.cat(ms), torch.cat(rests))
        if entry is not None:
            entry.rows[key] = (m, rest)
        return m, rest

    def judge(self, loss: float, grad: torch.Tensor, x: dict[str, torch.Tensor], c: float):
        """(loss comparison, the gradient's comparator) against the reference of `x`, upstream `c` applied."""
        run = self.run
        ref_loss = run.reference_loss(x)
        cmp = GradientComparator(run.tol.gradient, run.seq_next, run.width)
        flat = grad.view(-1, run.width)
        z = x["logits"].reshape(-1, run.width)
        targets = self._targets(x["completion_ids"])
        # accumulated on the device and read once at the end (a float() per chunk made the host wait for the
        # GPU twice a chunk); the same float64 additions in the same order, so the same bits
        f64 = dict(dtype=torch.float64, device=z.device)
        # d loss / d logp times each row's fp32 log-prob resolution (chunk.scale is / T); the loss's move
        # under the derived log-prob error bound, weights included
        loss_floor, loss_logp = torch.zeros((), **f64), torch.zeros((), **f64)
        T = run.model.temperature
        # The fused comparison forms the reference values itself from the logits (FormedRows): no float64
        # chunk is materialised (docs/checks.md, "Fused comparison")
        formed = fused_comparison(flat)
        queued: list[tuple] = []
        with PHASES("reference"):  # the chunks are computed lazily: their float64 work counts in `reference`
            chunks = iter(chunked_gradient(x, run.model.params, logp_error=self.logp_error(x), logp=run._logp(x),
                                           form=not formed))
        while True:
            with PHASES("reference"):
                chunk = next(chunks, None)
            if chunk is None:
                break
            scale = chunk.scale * abs(c)
            tc = targets[chunk.start : chunk.stop]
            m, rest = self._row_floors(x, chunk, z, targets)
            loss_floor += T * (FP32_RESOLUTION * (1.0 + m) * chunk.scale.to(torch.float64)).sum()
            floor = (FP32_RESOLUTION * (1.0 + m) * scale.to(torch.float64)).clamp_min(run.subnormal)
            target = (tc, torch.where(tc >= 0, rest * scale.to(torch.float64), torch.zeros_like(rest)))
            logp = None
            if chunk.coef_error is not None:  # rows with a ratio: its fp32 log-prob error moves the whole row
                logp = (chunk.coef * c, chunk.coef_error * abs(c))
                loss_logp += chunk.loss_error.sum().to(torch.float64)
            if formed:  # views and per-row vectors only: held until every chunk's kernel is queued
                expected = FormedRows(z[chunk.start : chunk.stop], tc, chunk.row_coef if c == 1.0 else chunk.row_coef * c, T)
                queued.append((chunk.start, flat[chunk.start : chunk.stop], expected, scale, floor, target, logp))
            else:
                expected = chunk.values if c == 1.0 else chunk.values * c  # x * 1.0 is x: one float64 pass less
                cmp.update(chunk.start, flat[chunk.start : chunk.stop], expected, scale, floor, target, logp)
        cmp.update_many(queued)  # one read of the device for all of them (formed: the fused comparison)
        floor_sum, logp_sum = torch.stack([loss_floor, loss_logp]).tolist()
        return compare_loss(loss, ref_loss, run.tol.loss, max(floor_sum, logp_sum)), cmp

    def logp_error(self, x: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """[B, S]: the bound of an fp32 implementation's error in each log-prob (`fp32_logp_error`),
        None where the loss does not depend on log-probs (no ratio, no KL: token-is, the seed spec).
        fp32 arithmetic is what every logits dtype requires, so bf16 and fp16 logits get the same bound.
        Once per pristine content and parameters (reference_cache.py)."""
        run = self.run
        if not run.model.uses_logprobs(x):
            return None
        slot = run._slot_of(x)
        entry = None if slot is None else run.refs.entry(run.slot_key(slot), run.model.values)
        if entry is not None and entry.logp_error_known:
            return entry.logp_error
        with PHASES("reference"):
            grid = logp_error_grid(x["logits"].reshape(-1, run.width), run.model.temperature, run.seq_next)
        if entry is not None:
            entry.logp_error, entry.logp_error_known = grid, True
        return grid

    def loss_floor(self, x: dict[str, torch.Tensor]) -> float:
        """The absolute loss allowance `judge` gives for fp32 log-probs, without the gradient (forward-only
        calls): the larger of T * the rows' fp32 floors of |dL/dlogp| and the derived move of the loss."""
        run = self.run
        grid = self.logp_error(x)
        logp = run._logp(x)
        with PHASES("reference"):
            return loss_allowance(x, run.model.params, run.model.temperature, self.row_scales(x), logp, grid)

    def row_scales(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per flattened logits row, |dL/dlogp| / T (`reference.row_scales`), from the cached log-probs."""
        run = self.run
        logp = run._logp(x)
        with PHASES("reference"):
            return row_scales(x, run.model.params, logp, run.model.temperature)

    def _targets(self, ids: torch.Tensor) -> torch.Tensor:
        """The target column of every flattened logits row, -1 at the last position of a sequence."""
        out = torch.full((ids.shape[0], self.run.seq_next), -1, dtype=torch.long, device=ids.device)
        out[:, : ids.shape[1]] = ids.long()
        return out.view(-1)

    def relation(self, actual: torch.Tensor, expected: torch.Tensor, x: dict[str, torch.Tensor],
                 upstream: float = 1.0, scales: torch.Tensor | None = None) -> GradientComparator:
        """Compare two outputs of the implementation (both rounded, hence twice the slack); `scales`:
        row scales computed beforehand (inputs poisoned on purpose must not set the allowance)."""
        run = self.run
        cmp = GradientComparator(run.tol.gradient, run.seq_next, run.width, slack=2.0)
        a, e = actual.view(-1, run.width), expected.view(-1, run.width)
        scales = (self.row_scales(x) if scales is None else scales) * abs(upstream)
        step = rows_per_chunk(run.width, device=run.device)
        for start in range(0, a.shape[0], step):
            cmp.update(start, a[start : start + step], e[start : start + step], scales[start : start + step])
        return cmp


def recheck_gradient(spec, resolved, tol, grad: torch.Tensor, x: dict[str, torch.Tensor], model: Any,
                     c: float) -> GradientComparator:
    """A timed call's gradient re-checked against the reference at `model`'s parameters (the declared
    defaults), row by row with the fp32 floors (`checks/timed.py`, `_recheck`). On CUDA the reference rows
    are formed inside the fused comparison (FormedRows), as `RowJudge.judge` does: no float64 chunk is
    materialised, and every chunk's result comes back in one read (95 ms a re-check at mask-b8 on the
    H200 with float64 chunks, round32c). Where the rows carry a ratio and the gradient misses, it is
    judged again with conformance's allowance for fp32 log-prob errors through the ratio (the bounds cost
    a float64 pass: derived only where they can change the verdict)."""
    cmp = _recheck_rows(resolved, tol, grad, x, model, c)
    if cmp.passed or not needs_logprobs(x, model.params):
        return cmp
    grid = logp_error_grid(x["logits"].reshape(-1, cmp.width), model.temperature, cmp.seq_next)
    return _recheck_rows(resolved, tol, grad, x, model, c, grid)


def _recheck_rows(resolved, tol, grad, x, model, c: float, logp_error=None) -> GradientComparator:
    cmp = GradientComparator(tol.gradient, resolved.axes["seq_next"], resolved.shapes["logits"][-1])
    flat = grad.view(-1, cmp.width)
    z = x["logits"].reshape(-1, cmp.width)
    formed = fused_comparison(flat)
    params, T = model.params, model.temperature
    targets = torch.nn.functional.pad(x["completion_ids"].long(), (0, 1), value=-1).reshape(-1)
    queued: list[tuple] = []
    for chunk in chunked_gradient(x, params, logp_error=logp_error, form=not formed):
        scale = chunk.scale * abs(c)
        rows = slice(chunk.start, chunk.stop)
        floor = _fp32_floor_in_pieces(z[rows], T, scale, cmp.width, z.device)
        logp = None if chunk.coef_error is None else (chunk.coef * c, chunk.coef_error * abs(c))
        if formed:
            expected = FormedRows(z[rows], targets[rows], chunk.row_coef if c == 1.0 else chunk.row_coef * c, T)
            queued.append((chunk.start, flat[rows], expected, scale, floor, None, logp))
        else:
            cmp.update(chunk.start, flat[rows], chunk.values * c, scale, floor, None, logp)
    cmp.update_many(queued)
    return cmp


def row_floor_parts(z: torch.Tensor, targets: torch.Tensor, temperature: float,
                    kernel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(max|z|/T, min(1 - p_t, V 2^-24)) of rows z [rows, V] with target columns `targets` (-1: none):
    `fp32_floor`'s and `fp32_target_floor`'s terms without their row scale. `kernel` (CUDA, contiguous rows:
    `reference.kernel_reference`): both from one read of the rows (`reference_kernel.row_floor_terms`), where
    torch makes a float64 copy of the rows and ~8 passes over it, and one more pass for the maximum. The
    maximum is the same value either way; the target's log-prob differs in its last bits (1e-13 relative).
    The maximum is divided by T as a device tensor, not a Python float: for a host scalar CUDA multiplies by
    1/T, an ulp off the CPU's division (round35a on the H200: the test of this failed); a tensor divisor
    is a true division on both."""
    ones = torch.ones(z.shape[0], dtype=torch.float64, device=z.device)
    if kernel:
        # local: Triton is imported only where a GPU runs it (optional on the CPU)
        from grpo_conform.ops.grpo_logits.reference_kernel import row_floor_terms

        amax, logp = row_floor_terms(z, targets.clamp_min(0), temperature)
        rest = target_floor_from_logp(logp, targets, z.shape[-1], ones)
    else:
        amax, rest = z.abs().amax(dim=-1).to(torch.float64), fp32_target_floor(z, targets, temperature, ones)
    return amax / amax.new_full((), float(temperature)), rest


def _fp32_floor_in_pieces(z: torch.Tensor, temperature: float, scale: torch.Tensor, width: int, device) -> torch.Tensor:
    """`fp32_floor` of a chunk's rows, a float64 budget's rows at a time (a formed chunk spans up to
    FORMED_CHUNK_ROWS rows; abs() of all of them at once would copy the chunk)."""
    step = rows_per_chunk(width, device=device)
    if z.shape[0] <= step:
        return fp32_floor(z, temperature, scale)
    return torch.cat([fp32_floor(z[i : i + step], temperature, scale[i : i + step]) for i in range(0, z.shape[0], step)])


def recheck_loss_floor(resolved, x: dict[str, torch.Tensor], model: Any) -> float:
    """The absolute loss allowance conformance gives (`RowJudge.loss_floor`), at `model`'s parameters, for a
    timed call's re-check: the larger of T * the rows' fp32 floors of |dL/dlogp| and how far the loss moves
    under the fp32 log-prob error bounds. A timed call of vespo-mask at mask-b8 (H200, thirteenth session)
    left its loss 7.7e-4 from the reference against 2.3e-4 relative: its weight is exp of a sequence's sum
    of log-ratios, and rows near +-1e4 carry fp32 log-prob errors of ~1e-3."""
    params, T = model.params, model.temperature
    width, seq_next = resolved.shapes["logits"][-1], resolved.axes["seq_next"]
    logp = reference_logprobs(x, params) if needs_logprobs(x, params) else None
    grid = None if logp is None else logp_error_grid(x["logits"].reshape(-1, width), T, seq_next)
    return loss_allowance(x, params, T, row_scales(x, params, logp, T), logp, grid)


def logp_error_grid(z: torch.Tensor, temperature: float, seq_next: int) -> torch.Tensor:
    """[B, S]: `fp32_logp_error` of every scored row of the flattened logits `z`, a float64 budget's rows at a
    time (the left-over last positions dropped)."""
    step = rows_per_chunk(z.shape[-1], device=z.device)
    rows = torch.cat([fp32_logp_error(z[i : i + step], temperature) for i in range(0, z.shape[0], step)])
    return rows.view(-1, seq_next)[:, :-1]


def row_scales(x: dict[str, torch.Tensor], params, logp: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Per flattened logits row, |dL/dlogp| / T (`reference.row_scales`; 0 on the last positions)."""
    scale = token_terms(x, params, logp).scale / temperature
    return torch.nn.functional.pad(scale.to(torch.float64), (0, 1)).reshape(-1)


def loss_allowance(x: dict[str, torch.Tensor], params, temperature: float, scales: torch.Tensor,
                   logp: torch.Tensor | None, grid: torch.Tensor | None) -> float:
    """The absolute loss allowance for fp32 log-probs: the larger of T * the rows' fp32 floors of |dL/dlogp|
    (`scales`) and how far the loss moves under the log-prob error bounds `grid` (None: no log-probs)."""
    z = x["logits"].reshape(-1, x["logits"].shape[-1])
    step = rows_per_chunk(z.shape[-1], device=z.device)
    direct = torch.zeros((), dtype=torch.float64, device=z.device)  # summed on the device, read once
    for i in range(0, z.shape[0], step):
        direct += temperature * fp32_floor(z[i : i + step], temperature, scales[i : i + step]).sum()
    if grid is None:
        return float(direct)
    moved = token_terms(x, params, logp, grid).loss_error.sum().to(torch.float64)
    return float(torch.maximum(direct, moved))
