"""Two probes of grpo-fused-linear on values its draws avoid (the twenty-seventh session's adversarial round):

- `zero-row` (Z): one kept hidden row set to exact zeros. Every drawn row comes from a profile (normal, wide,
  large, peaked, heavy-tailed), so none was ever exactly zero, and a kernel that takes zero rows for padding
  (leaving them out of the loss and of the token counts) passed every default run
  (`tests/gallery/fused-zero-row-as-padding`). A zero hidden state is a legal input: its logits are the bias,
  or all equal.
  A second call (ZV) zeroes lm_head rows instead: trailing ones (a padded vocabulary) and a few interior ones
  (`zero_vocab_rows`), a legal head that the drawn N(0, 1/H) weight never was.
- `reference-head` (RH, members with `ref_weight`): the reference lm_head drawn far enough from the policy's
  that the reference log-probs move by ~1 nat. The drawn one is the policy's plus 0.1% noise (a 'large' row
  of logits ~1e3 then moves by ~1), which moves the KL term less than bfloat16's allowance: a kernel reading
  the policy weight for the reference passed every default run (`tests/gallery/fused-reference-weight-ignored`).
  Here the noise is scaled on the set itself (the 99th percentile of |(hidden @ noise^T) / T| over the rows is
  1), and the KL coefficient and the temperature are at least their draws' tops. Two more calls follow on that
  set, for the reference operands as trainers pass them (red team 2026-12; each input came from a buffer of
  its own and ref_hidden was always given, so a kernel wrong only otherwise passed every run):
  RA, ref_hidden left out (the spec: "ref_hidden absent: hidden"; every bundled fused implementation takes
  that call), judged against the set with ref_hidden = hidden (`fused-ref-hidden-absent-drops-kl`), then RA-same,
  ref_hidden given as hidden's own tensor (`fused-ref-hidden-aliased-policy-head`, forty-second session);
  RS, ref_weight the weight's own tensor (a frozen lm_head shared by policy and reference, as under LoRA:
  the same object with weight and bias frozen; or, drawn, a detach() or a view of the trainable weight)
  with ref_hidden the drawn one moved as ref_weight was (`fused-ref-head-shared-skips-ref-hidden`). A kernel
  cannot tell either call from a trainer's: the aliasing and the omission are what a trainer hands over.

All judge loss and gradients against the reference (PLAIN) and run once per worker process and member.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, PLAIN, Probe, WorkloadConformance
from grpo_conform.checks.model import ReferenceModel
from grpo_conform.spec.draws import draw_for
from grpo_conform.ops.grpo_probes import live_row, mask_input

ZERO_TRAILING_MAX = 127  # a padded vocabulary's zero rows: up to one short of a multiple of 128
ZERO_INTERIOR = 3  # zero-initialised rows among the others

#: the reference log-probs' move the reference-head probe aims at: the 99th percentile of |d logit| over rows
REFERENCE_MOVE = 1.0
SAMPLE_ROWS = 256


def zero_row(run: WorkloadConformance) -> None:
    """Z: a fresh set with one kept hidden row (and its reference hidden row, where given) set to exact zeros."""
    if run.made_in("zero_row") is not None:
        return
    P = run.P
    run.generate(P, run.seeds[0] ^ 0x2E40)  # a set of its own, not what earlier probes left in P
    b = live_row(run, P)
    mask = mask_input(run)
    kept = list(range(run.rw.axes["seq"])) if mask is None else (P.tensors[mask][b] != 0).nonzero().view(-1).tolist()
    t = kept[run.rng.randrange(len(kept))] if kept else 0
    for n in ("hidden", "ref_hidden"):
        if n in P.tensors:
            P.tensors[n][b, t].zero_()
    P.commit()
    run.draws["zero_row"] = [b, t]
    call = run.call("Z", P, run.out1, PLAIN + CALL)
    if call is not None:
        J.plain(run, call)
    zero_vocab_rows(run)


def zero_vocab_rows(run: WorkloadConformance) -> None:
    """ZV: a fresh set whose lm_head has exactly zero rows: a drawn number of trailing ones (a vocabulary padded to a
    multiple of 64 or 128, as Megatron and tensor-parallel heads are; Qwen2.5 pads 151,665 tokens to 151,936) and
    ZERO_INTERIOR interior ones (tokens added with zero-initialised rows), their bias entries 0 where the member has
    a bias, the reference head's rows likewise, one kept token's id on an interior zero row. Every such row is a
    real entry of the softmax (logit = bias = 0) with a weight gradient. The drawn weight is N(0, 1/H), so no row was
    ever zero, and a kernel masking trailing zero rows as padding passed every default run
    (`tests/gallery/fused-padded-vocab-zero-rows`). Old and reference log-probs move with the policy's (the drawn
    ratios and KL gaps stay). How a hostile kernel tells it apart: by the zero rows themselves, which is what a
    padded or grown vocabulary hands over; one that treats zero rows as padding only past some count (or only
    at 64/128-aligned ends) passes where the drawn count misses it."""
    P, params = run.P, run.model.params
    run.generate(P, run.seeds[0] ^ 0x2E41)
    x = P.pristine
    vocab = x["weight"].shape[0]
    r = random.Random(run.seeds[0] ^ 0x2E42)
    trailing = r.randint(1, max(1, min(ZERO_TRAILING_MAX, vocab // 8)))
    interior = r.sample(range(vocab - trailing), min(ZERO_INTERIOR, vocab - trailing - 1))
    rows = torch.tensor(sorted(interior) + list(range(vocab - trailing, vocab)))
    drawn = run.op.policy_logprobs(run.spec, x, params)
    new = {}
    for n in ("weight", "bias", "ref_weight", "ref_bias"):
        if x.get(n) is not None:
            new[n] = x[n].clone()
            new[n][rows.to(x[n].device)] = 0
    ids, mask = x["completion_ids"].clone(), mask_input(run)
    b = live_row(run, P)
    kept = (x[mask][b] != 0).nonzero().view(-1).tolist() if mask else list(range(ids.shape[1]))
    if kept and interior:
        ids[b, kept[r.randrange(len(kept))]] = interior[0]
        new["completion_ids"] = ids
    P.write(new)
    logp = run.op.policy_logprobs(run.spec, P.pristine, params)
    moved = {n: (x[n].cpu().double() + (logp - drawn)).to(x[n].device, x[n].dtype)
             for n in ("old_logprobs", "ref_logprobs") if n in x}
    P.write(moved)
    run.draws["zero_vocab_rows"] = {"trailing": trailing, "interior": sorted(interior)}
    call = run.call("ZV", P, run.out1, PLAIN + CALL)
    if call is not None:
        J.plain(run, call)


def reference_head(run: WorkloadConformance) -> None:
    """RH: the reference lm_head moved from the policy's so that the reference log-probs move by ~1 nat."""
    if run.made_in("reference_head") is not None:
        return
    # the KL coefficient at least its draws' top (at a drawn 0.01 the KL term moved the gradient less than the
    # allowance: the folder passed CI run 146 once), the temperature at least its draws' top: at a drawn 0.47
    # the bf16 allowance, which grows as 1/T, held a gradient 30-43% off (Frobenius) and the folder passed 2
    # runs of 8. Both are parameters of the call, not of the reference weight this probe is about; the set is
    # drawn at them (old log-probs follow the temperature).
    values = dict(run.model.values)
    for name in ("beta", "temperature"):
        top_draw = draw_for(run.spec, name)
        if top_draw is not None and name in values:
            values[name] = max(float(values[name]), float(top_draw.max))
    drawn, run.model = run.model, ReferenceModel(run.spec, values)
    try:
        _reference_head_call(run, values)
    finally:
        run.model = drawn


def _reference_head_call(run: WorkloadConformance, values: dict) -> None:
    P = run.P
    # a set of its own, not what earlier probes left in P, every token kept: the KL term acts on kept tokens only,
    # and a drawn layout with few of them left the folder passing 1 run in 5
    mask = mask_input(run)
    given = {mask: torch.ones(P.tensors[mask].shape, dtype=P.tensors[mask].dtype)} if mask else None
    run.generate(P, run.seeds[0] ^ 0x2EF0, given=given)
    weight = P.tensors["weight"]
    hidden = P.tensors.get("ref_hidden", P.tensors["hidden"]).reshape(-1, weight.shape[1])
    gen = torch.Generator(device=weight.device).manual_seed(run.seeds[0] ^ 0x2EF1)
    noise = torch.randn(weight.shape, generator=gen, device=weight.device, dtype=weight.dtype)
    # the scale from at most SAMPLE_ROWS rows, in the operands' dtype: a seed shape's full product is ~1 GB
    rows = torch.randperm(hidden.shape[0], generator=torch.Generator().manual_seed(run.seeds[0]))[:SAMPLE_ROWS]
    temperature = float(values.get("temperature", 1.0))
    moves = torch.nan_to_num(hidden[rows.to(hidden.device)] @ noise.t()).float().abs().reshape(-1) / temperature
    top = float(torch.quantile(moves[: 1 << 24].double().cpu(), 0.99)) if moves.numel() else 0.0
    scale = REFERENCE_MOVE / top if top > 0 else 0.0
    P.tensors["ref_weight"].copy_(weight + scale * noise)
    P.commit()
    run.draws["reference_head"] = {"noise_scale": scale, "beta": values.get("beta"), "temperature": temperature}
    call = run.call("RH", P, run.out1, PLAIN + CALL)
    if call is not None:
        J.plain(run, call)
    if "ref_hidden" in P.tensors:
        _reference_operands(run, rows, temperature)


def _reference_operands(run: WorkloadConformance, rows: torch.Tensor, temperature: float) -> None:
    """RA and RS (the module docstring) on RH's set."""
    P = run.P
    hidden, weight = P.tensors["hidden"], P.tensors["weight"]
    drawn = P.tensors["ref_hidden"].clone()
    P.tensors["ref_hidden"].copy_(hidden)  # the reference of the call without it
    P.commit()
    call = run.call("RA", P, run.out1, PLAIN + CALL, omit=["ref_hidden"])
    if call is not None:
        J.plain(run, call)
    # RA-same: ref_hidden given as hidden's own tensor, the far head kept (a trainer whose reference shares the
    # policy's trunk): a dual-head path that read the policy's head there passed every run
    call = run.call("RA-same", P, run.out1, PLAIN + CALL, same={"ref_hidden": ["hidden", "object"]})
    if call is not None:
        J.plain(run, call)
    # ref_weight = weight; ref_hidden = hidden + s (drawn - hidden), s putting the reference log-probs ~1 nat
    # from the policy's (as RH's noise): with the drawn 0.5 a kernel taking the policy's log-probs for the
    # reference moved the KL term by less than bf16's allowance on some rows
    d = (drawn.float() - hidden.float()).reshape(-1, weight.shape[1])
    moves = (d[rows.to(d.device)] @ weight.float().t()).abs().reshape(-1) / temperature
    top = float(torch.quantile(moves[: 1 << 24].double().cpu(), 0.99)) if moves.numel() else 0.0
    scale = REFERENCE_MOVE / top if top > 0 else 1.0
    P.tensors["ref_weight"].copy_(weight)
    P.tensors["ref_hidden"].copy_(hidden.float() + scale * (drawn.float() - hidden.float()))
    P.commit()
    names = [g.input for g in run.spec.gradients]
    # drawn on a stream of its own (the draws of later probes do not move): the same object with the head
    # frozen, a detach() of the trainable weight, or a view of that
    how = ("object", "detach", "view")[random.Random(run.seeds[0] ^ 0x2EF2).randrange(3)]
    only = tuple(n for n in names if n not in ("weight", "bias")) if how == "object" else None
    run.draws["reference_operands"] = {"ref_hidden_scale": scale, "ref_weight": how}
    call = run.call("RS-" + how, P, run.out1, PLAIN + CALL, same={"ref_weight": ["weight", how]}, only=only)
    if call is not None and only is None:
        J.plain(run, call)
    elif call is not None:  # the frozen head has no gradient: judged as the frozen probe judges its calls
        J.versus_reference(run, "gradient", call, "ref_weight the frozen weight's own tensor, hidden alone trainable")


def _has_ref_weight(spec: Any) -> str | None:
    return None if spec.has_input("ref_weight") else "the member has no reference lm_head (ref_weight)"


def _fused(spec: Any) -> str | None:
    return None if spec.has_input("hidden") else "grpo-logits: its logits are given, so no hidden row exists"


VALUE_PROBES = (
    Probe("zero-row", zero_row.__doc__, zero_row, PLAIN + CALL, applies=_fused),
    Probe("reference-head", reference_head.__doc__, reference_head, PLAIN + CALL, applies=_has_ref_weight),
)
