"""How the logits-only probes (`ops/grpo_logits/probes.py`) judge their calls: each changes or compares
rows of the given logits (one row per (sequence, position), the vocabulary along it), which only
grpo-logits has. Moved unchanged from `checks/judging.py` (issue 30); the generic judging (contract,
loss and gradient, finiteness, freshness, re-reads) stays there and is used from here."""

from __future__ import annotations

import torch

from grpo_conform.checks.conformance import Call, WorkloadConformance
from grpo_conform.checks.judging import finite
from grpo_conform.compare import json_float
from grpo_conform.ops.grpo_logits.reference import rows_per_chunk


def advantage_sign(run: WorkloadConformance, c: Call, g_a: torch.Tensor) -> None:
    rel = run.rows.relation(c.grad, -g_a, c.slot.pristine)  # negation is exact in any float dtype
    run.book.record("advantage-sign", c.label, rel.passed, "negated advantages negate the gradient" if rel.passed
                    else "negating the advantages did not negate the gradient: " + rel.describe(),
                    {"compared_with": "-gradient of call A", **rel.evidence()})


def row_locality(run: WorkloadConformance, g_d: torch.Tensor, c: float) -> None:
    Q = run.Q
    # A row whose gradient is not 0 by the semantics (clipped and masked tokens have none).
    scales = run.rows.row_scales(Q.pristine)
    live = [int(r) for r in (scales > 0).nonzero().flatten() if int(r) % run.seq_next != run.seq_next - 1]
    if not live:
        run.book.skip("row-locality", "no row of these inputs has a non-zero gradient")
        return
    # Among the largest quarter, so that the change shows above the dtype's rounding (fp16 underflows;
    # with issue 27's small advantages the upper half still held rows an honest fp16 kernel could not
    # show a change in: pytorch and triton each failed once on fp16-small).
    cut = float(torch.quantile(scales[live].to(torch.float64), 0.75))
    live = [r for r in live if float(scales[r]) >= cut]
    row = live[run.rng.randrange(len(live))]
    b, t = row // run.seq_next, row % run.seq_next
    run.draws["row_locality_row"] = [b, t]
    original = Q.tensors["logits"][b, t].clone()
    saved = {k: Q.tensors[k][b, t].clone() for k in ("old_logprobs", "ref_logprobs") if k in Q.tensors}
    g = torch.Generator(device=run.device).manual_seed(run.rng.getrandbits(62))
    fresh_row = torch.randn(run.width, generator=g, device=run.device) * 2.0
    before = _token_logp(original, Q.tensors["completion_ids"][b, t], run.model.temperature)
    Q.tensors["logits"][b, t] = fresh_row.to(original.dtype)
    # Old and reference log-probs follow the new row (same log-ratio and KL gap as before), so
    # the token stays in the clip region it was drawn in.
    shift = _token_logp(Q.tensors["logits"][b, t], Q.tensors["completion_ids"][b, t], run.model.temperature) - before
    for k, v in saved.items():
        Q.tensors[k][b, t] = (v.to(torch.float64) + shift).to(v.dtype)
    Q.commit()
    f = run.call("F", Q, run.out1, ("row-locality", "finite", "no-mutation", "no-aliasing"), upstream=c)
    if f is not None:
        finite(run, f)
        changed_row = b * run.seq_next + t
        differs = differing_rows(run, f.grad, g_d, Q.pristine, c)
        if run.spec.parameter_values.get("importance_sampling_level") == "sequence":
            # A sequence-level ratio couples every token of a sequence: only other sequences must keep.
            others = [r for r in differs if r // run.seq_next != b]
        else:
            others = [r for r in differs if r != changed_row]
        _, cmp = run.judge(f)
        ok = not others and changed_row in differs and cmp.passed
        if others:
            r = others[0]
            msg = (f"changing logits row ({b}, {t}) changed {len(others)} other gradient rows, "
                   f"first ({r // run.seq_next}, {r % run.seq_next})")
        elif changed_row not in differs:
            msg = f"changing logits row ({b}, {t}) did not change its gradient row"
        elif not cmp.passed:
            msg = "the changed row does not match the reference: " + cmp.describe()
        else:
            msg = f"changing logits row ({b}, {t}) changed that gradient row only"
        run.book.record("row-locality", f.label, ok, msg, {"changed_row": [b, t], "other_rows_changed": len(others),
                                                           "gradient": cmp.evidence()})
    Q.tensors["logits"][b, t] = original
    for k, v in saved.items():
        Q.tensors[k][b, t] = v
    Q.commit()


def _token_logp(row: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    z = row.to(torch.float64) / temperature
    return z[target] - torch.logsumexp(z, dim=-1)


def differing_rows(run: WorkloadConformance, a: torch.Tensor, e: torch.Tensor, x: dict, c: float) -> list[int]:
    """Flattened rows where two outputs differ beyond twice the element tolerance, chunk by chunk."""
    t = run.tol.gradient
    a, e = a.view(-1, run.width), e.view(-1, run.width)
    scales = run.rows.row_scales(x) * abs(c)
    step = rows_per_chunk(run.width, device=run.device)
    rows: list[int] = []
    for start in range(0, a.shape[0], step):
        ac, ec = a[start : start + step].to(torch.float64), e[start : start + step].to(torch.float64)
        allowed = 2 * (t.element_rtol * ec.abs() + t.element_atol_row_scale * scales[start : start + step, None]
                       + t.element_atol)
        bad = (~((ac - ec).abs() <= allowed)).any(dim=1)
        rows += [start + int(r) for r in bad.nonzero().flatten()]
    return rows


def last_row(run: WorkloadConformance, g_d: torch.Tensor, loss_d: float, c: float) -> None:
    Q = run.Q
    logits = Q.tensors["logits"]
    original = logits[:, -1, :].clone()
    scales = run.rows.row_scales(Q.pristine)  # from the unpoisoned inputs
    for i, kind in enumerate(run.spec.validation.poison.last_position):
        value = {"nan": float("nan"), "inf": float("inf"), "huge": torch.finfo(logits.dtype).max}[kind]
        logits[:, -1, :] = value
        Q.commit()
        g = run.call(f"G{i + 1}", Q, run.out1, ("last-row-ignored", "no-mutation", "no-aliasing"), upstream=c)
        if g is not None:
            rel = run.rows.relation(g.grad, g_d, Q.pristine, c, scales)
            loss_ok = abs(g.loss - loss_d) <= run.tol.loss.allowed(loss_d)
            ok = rel.passed and loss_ok and rel.last_rows_nonzero == 0
            run.book.record("last-row-ignored", g.label, ok, f"logits[:, S, :] = {kind} changed no output" if ok else
                            f"logits[:, S, :] = {kind} changed the outputs: loss {g.loss!r} vs {loss_d!r}; "
                            + rel.describe(),
                            {"poison": kind, "loss": json_float(g.loss), "loss_before": json_float(loss_d),
                             "gradient": rel.evidence(), "last_row": rel.last_row_evidence()})
    logits[:, -1, :] = original
    Q.commit()


def masked_positions(run: WorkloadConformance, g_d: torch.Tensor, loss_d: float, c: float) -> None:
    Q = run.Q
    mask = Q.tensors["completion_mask"].to(torch.bool)
    masked = (~mask).nonzero()
    if masked.numel() == 0:
        run.book.skip("masked-positions", "these inputs mask no position")
        return
    b, t = masked[:, 0], masked[:, 1]
    nonzero = int((g_d[b, t] != 0).sum())
    logits = Q.tensors["logits"]
    original = logits[b, t].clone()
    g = torch.Generator(device=run.device).manual_seed(run.rng.getrandbits(62))
    logits[b, t] = (torch.randn(original.shape, generator=g, device=run.device) * 3.0).to(logits.dtype)
    Q.commit()
    m = run.call("M", Q, run.out1, ("masked-positions", "finite", "no-mutation", "no-aliasing"), upstream=c)
    if m is not None:
        rel = run.rows.relation(m.grad, g_d, Q.pristine, c)
        loss_ok = abs(m.loss - loss_d) <= run.tol.loss.allowed(loss_d)
        still = int((m.grad[b, t] != 0).sum())
        ok = nonzero == 0 and still == 0 and rel.passed and loss_ok
        msg = (f"{masked.shape[0]} masked positions: exactly zero gradient, their logits change nothing" if ok else
               f"{nonzero + still} gradient values at masked positions are not 0" if nonzero + still else
               f"redrawing the logits of masked positions changed the outputs: loss {m.loss!r} vs {loss_d!r}; "
               + rel.describe())
        evidence = {"masked_positions": int(masked.shape[0]), "nonzero_at_masked": nonzero + still,
                    "loss": json_float(m.loss), "loss_before": json_float(loss_d), "gradient": rel.evidence()}
        leaked = [] if ok else ["logits"]  # a gradient there, or outputs that moved with them: the logits reach it
        try:
            if not ok:
                masked_inputs_reaching(run, m, b, t, c, leaked)
        finally:  # a worker lost during the extra calls must not lose this verdict
            if leaked:
                evidence["reached_output"] = leaked
                msg += f"; masked values of {', '.join(leaked)} reach the output"
            run.book.record("masked-positions", m.label, ok, msg, evidence)
    logits[b, t] = original
    Q.commit()


MASKED_INPUTS = ("old_logprobs", "ref_logprobs", "sampling_ratio")  # per-token inputs a mask must hide


def masked_inputs_reaching(run: WorkloadConformance, m: Call, b: torch.Tensor, t: torch.Tensor, c: float,
                           found: list[str]) -> None:
    """After a masked-positions failure only: which per-token inputs other than the logits reach the
    outputs through their masked positions. Each is redrawn there alone (finite values, the log-probs
    shifted by N(0, 1), the sampling ratio scaled by exp(N(0, 0.5))) and the call repeated; the input
    is named (appended to `found`) when the loss or the gradient moves beyond twice the tolerance. A
    call that fails here counts against `runs` only."""
    Q = run.Q
    base_grad, base_loss = m.grad.clone(), m.loss
    for name in (n for n in MASKED_INPUTS if n in Q.tensors):
        tensor = Q.tensors[name]
        original = tensor[b, t].clone()
        g = torch.Generator(device=run.device).manual_seed(run.rng.getrandbits(62))
        noise = torch.randn(original.shape, generator=g, device=run.device, dtype=torch.float64)
        moved = original.to(torch.float64) * torch.exp(0.5 * noise) if name == "sampling_ratio" else \
            original.to(torch.float64) + noise
        tensor[b, t] = moved.to(tensor.dtype)
        Q.commit()
        try:
            k = run.call(f"M-{name}", Q, run.out1, (), upstream=c)
        finally:
            tensor[b, t] = original
            Q.commit()
        if k is None:
            continue
        rel = run.rows.relation(k.grad, base_grad, Q.pristine, c)
        loss_moved = not abs(k.loss - base_loss) <= 2 * run.tol.loss.allowed(base_loss)
        if loss_moved or not rel.passed:
            found.append(name)
