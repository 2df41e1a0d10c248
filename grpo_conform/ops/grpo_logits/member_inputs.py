"""The optional inputs of family members, drawn from the parent's seed (docs/spec-family.md):

- `completion_mask`: the layouts of `generators.masks` (right and left padding, interior holes, a
  single token, full and empty rows), rotated over a workload's input sets; timed workloads aim
  at the spec's `unmasked_fraction` (~75%, the anchors' configuration), rows right- or left-padded, their
  conformance sets with the edge rows (empty, single, full) beside them.
  bool or int, as the buffer's dtype says.
- `old_logprobs`: logp - log(r) with r drawn, token by token (each row's positions in blocks that
  take every interval once; or one s_b per sequence at sequence level, each advantage sign's first
  where the clip binds, with per-token spread of mean 0), evenly over the intervals the clip
  boundaries cut (below 1 - eps_low, between, above 1 + eps_high, above delta; below/above the
  cispo cap), each shrunk by `boundary_margin` so fp32 and float64 classify every token alike. logp is the
  reference's own float64 value at the call's temperature, so pass the parameters of the call.
- `ref_logprobs`: logp + sign(A) * U[ref_gap_min, ref_gap_max] (the KL term adds to the policy
  term and 1 - exp(ref - logp) stays away from 0: see MemberInputs); `sampling_ratio`:
  log-uniform, both sides of the cap (TRL's sequence modes: each sequence's product of kept ratios
  on both sides of it, `sequence_sampling_ratios`).

Masked positions get values too (finite, in every region): a kernel that ignores the mask must
see a difference. Exact ties are not drawn here; `exact_tie_inputs` (the validator's `exact-ties`
probe) and `boundary_tie` (the reference's tests) make them; far gaps (|log r|, |ref - logp| up to
25) are `generators.logprob_gaps.far_ratio_inputs` (the `far-ratios` probe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from grpo_conform.dtypes import dtype_name
from grpo_conform.ops.grpo_logits.generators.advantages import SMALL_MAX
from grpo_conform.ops.grpo_logits.generators.judged_rows import free_one_sequence, one_judged_token
from grpo_conform.ops.grpo_logits.generators.knots import ratio_knots
from grpo_conform.ops.grpo_logits.generators.masks import classify, draw_mask, zero_apart
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_logprobs
from grpo_conform.spec import MemberInputs, ResolvedWorkload, Spec

OPTIONAL_INPUTS = ("completion_mask", "old_logprobs", "ref_logprobs", "sampling_ratio")
_SALT = 0x6D656D62  # separates these draws from the logits/ids/advantages streams of the same seed
EXACT_GAP = 192.0  # exact-tie rows: every other logit this far below the target (exactly representable)


def _cfg(spec: Spec) -> MemberInputs:
    return spec.validation.member_inputs


def fill_completion_mask(mask: torch.Tensor, rw: ResolvedWorkload, cfg: MemberInputs, gen: torch.Generator,
                         case: int | None = None, given: Mapping[str, torch.Tensor] | None = None,
                         advantages: torch.Tensor | None = None) -> torch.Tensor:
    """The drawn mask layouts written into `mask`, or the mask in `given` (drawn all the same, so the rest
    of the set follows the seed whatever is given); `advantages`: the set's, which `zero_apart` reads."""
    keep = _keep(tuple(mask.shape), rw, cfg, gen, case, given, advantages)
    mask.copy_(keep.to(mask.dtype))
    return keep


def _keep(shape: tuple[int, int], rw: ResolvedWorkload, cfg: MemberInputs, gen: torch.Generator,
          case: int | None, given: Mapping[str, torch.Tensor] | None,
          advantages: torch.Tensor | None = None) -> torch.Tensor:
    keep = draw_mask(*shape, case, rw.workload.timed, cfg.unmasked_fraction, gen)
    if given and "completion_mask" in given:
        return given["completion_mask"].reshape(shape) != 0
    return keep if advantages is None else zero_apart(keep, advantages)


def drawn_keep(spec: Spec, rw: ResolvedWorkload, shape: tuple[int, int], seed: int, case: int | None,
               given: Mapping[str, torch.Tensor] | None, advantages: torch.Tensor | None = None) -> torch.Tensor:
    """The keep mask `fill_member_inputs` will write for this seed, drawn ahead from a copy of its stream (the
    logits are drawn first, and `inputs._resolvable_rows` reads which rows are kept)."""
    return _keep(shape, rw, _cfg(spec), torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1)), case, given,
                 advantages)


# what a caller may fix (the trainer-shaped probe; ids: the deterministic-mode call's repeated tokens), the rest drawn
GIVEN = ("advantages", "completion_mask", "completion_ids")


class GivenInputError(ValueError):
    """A caller passed `given` values the generators do not take: a bug in the caller (a probe)."""


def check_given(given: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """`given` as a dict of CPU tensors, refusing names outside GIVEN."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(GIVEN))
    if unknown:
        raise GivenInputError(f"given inputs {unknown} are not drawn given others: pass only {list(GIVEN)}")
    return {k: v.detach().cpu() for k, v in given.items()}


def largest_by_sign(advantages: torch.Tensor) -> dict[int, int]:
    """{sign: row} for sign +1 and -1: the row of the largest |A| among the advantages of that sign (of equal ones
    the lowest row). With given advantages (a trainer's: the trainer-shaped probe) these rows are where the
    generators guarantee the clip binds (`draw_signed_log_ratios`; at token level the probe's mask keeps them
    long) and hold a binding token that is never near one-hot (`binding_positions`): the probe puts TS-lone's
    success on the -1 row."""
    a = advantages.detach().cpu().double().reshape(-1)
    out = {}
    for sign in (1, -1):
        side = a * sign > 0
        if bool(side.any()):
            out[sign] = int(torch.where(side, a.abs(), torch.tensor(-1.0, dtype=torch.float64)).argmax())
    return out


def binding_positions(advantages: torch.Tensor, seq: int, seed: int) -> dict[int, int]:
    """{row: position} for the rows of `largest_by_sign` (given advantages): a drawn position among the first two
    (every block of intervals holds them), where the token-level draw puts the interval in which the clip binds
    for the row's sign and the logits generators never put a near one-hot row (a token whose target holds
    nearly all the probability has no gradient to show the clip by). Only that token: confident tokens of real
    batches have ratios near 1, and a whole row kept off the peaked profile was a feature a kernel could test."""
    gen = torch.Generator().manual_seed((seed ^ 0xB1D1) & (2**63 - 1))
    out = {}
    for _, row in sorted(largest_by_sign(advantages).items()):
        out[row] = int(torch.randint(0, min(2, max(seq, 1)), (1,), generator=gen))
    return out


@dataclass(frozen=True)
class HostDraws:
    """What the generators hold on the host before a set's member inputs: the advantages as written (`[batch]`;
    reading them back from the device would wait for the logits' generation queued before) and, where they were
    given, the rows' binding positions (`binding_positions`); else (drawn) `case`, the set's index in its workload
    (`judged_rows.free_one_sequence` turns with it)."""

    advantages: torch.Tensor
    binding: dict[int, int] = field(default_factory=dict)
    drawn: bool = True
    case: int | None = None

    @classmethod
    def of(cls, advantages: torch.Tensor, given: Mapping[str, torch.Tensor], seq: int, seed: int,
           case: int | None = None) -> "HostDraws":
        a = advantages.detach().reshape(-1)
        if "advantages" in given:
            return cls(a, binding_positions(a, seq, seed), drawn=False)
        return cls(a, case=case)


def ratio_intervals(p: GrpoParameters, cfg: MemberInputs) -> list[tuple[float, float]]:
    """Ratio intervals between the boundaries, each kept `boundary_margin` (relative) away from them. Where
    epsilon_high lies inside the hard clip's unclipped band (an epsilon_high past 1 - epsilon_low: the declared
    cases' above-draws call) the band is split there too: CISPO's reading of it as a raw bound differs from the
    hard clip only between epsilon_high and 1 + epsilon_high, a third of the band's log-width (gallery
    epsilon-high-above-one-raw-bound: of 150 in-process sets of dapo-mask's above-draws call, 34 held no
    positive-advantage token there without the split, 20 with it). The drawn epsilons (at most 0.35) never reach
    the band, so no other set moves."""
    knots = ratio_knots(p)
    if p.loss_type != "cispo" and len(knots) > 1:
        knots = sorted(knots + [k for k in (p.epsilon_high,) if knots[0] < k < knots[-1]])
    edges = [min(cfg.ratio_min, knots[0] * 0.5)] + knots + [knots[-1] * cfg.ratio_max_factor]
    out = []
    for a, b in zip(edges, edges[1:]):
        lo, hi = a * (1 + cfg.boundary_margin), b * (1 - cfg.boundary_margin)
        if hi > lo:
            out.append((lo, hi))
    return out


def _log_uniform(which: torch.Tensor, u: torch.Tensor, intervals: list[tuple[float, float]]) -> torch.Tensor:
    """Log-ratios log-uniform inside interval `which[i]` at fraction `u[i]` of its log-width."""
    lo = torch.tensor([math.log(a) for a, _ in intervals], dtype=torch.float64)[which]
    hi = torch.tensor([math.log(b) for _, b in intervals], dtype=torch.float64)[which]
    return lo + u * (hi - lo)


def draw_log_ratios(n: int, intervals: list[tuple[float, float]], gen: torch.Generator) -> torch.Tensor:
    """n log-ratios spread evenly over the intervals (each one hit when n allows), log-uniform inside."""
    which = torch.randperm(n, generator=gen) % len(intervals)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    return _log_uniform(which, u, intervals)


def draw_signed_log_ratios(advantages: torch.Tensor, intervals: list[tuple[float, float]],
                           gen: torch.Generator, judged: torch.Tensor | None = None,
                           case: int | None = None) -> torch.Tensor:
    """One log-ratio per row (a sequence's, at sequence level), given each row's advantage: the rows of one
    sign take the intervals in blocks as `draw_row_log_ratios` does, and the first block starts where the clip
    binds for that sign, on the row of the largest |A| of the sign: the top interval for a positive advantage,
    the bottom one for a negative (the other rows in a drawn order). So a set whose advantages hold both signs
    (a trainer's group-normalised ones: the trainer-shaped probe) makes the clip bind on both sides on every
    draw; spread over the batch alone, one in five trainer-shaped sets had no row where it bound (a
    sequence-level clip dropped on them went unseen). The largest negative's row, below 1 - eps_low, is also
    where a positive advantage is not clipped: the probe's second call puts its large one there. `judged` ([batch]
    bool: the sequences with a kept token), for drawn advantages only: a set whose judged sequences are all such
    firsts (batch 1, a drawn batch of 2) has a gradient of exactly 0, so one is moved where it is not clipped
    (`judged_rows.free_one_sequence`; sequence-batch-one-shortcut passed `gradient` on every batch-1 call). Given
    advantages (the trainer-shaped probe) keep both signs bound: its second call relies on it."""
    a = advantages.detach().cpu().double().reshape(-1)
    sign, largest = torch.sign(a), largest_by_sign(a)
    k = len(intervals)
    which = torch.empty(sign.shape[0], dtype=torch.long)
    for s, first in ((1.0, k - 1), (-1.0, 0), (0.0, None)):
        rows = torch.nonzero(sign == s).squeeze(-1)
        if rows.numel() == 0:
            continue
        rows = rows[torch.randperm(rows.numel(), generator=gen)]
        if first is not None:  # the largest |A| of the sign first (`largest_by_sign`: the probe's row too)
            lead = int((rows == largest[int(s)]).nonzero())
            rows[[0, lead]] = rows[[lead, 0]]
        order = torch.rand(-(-rows.numel() // k), k, generator=gen).argsort(-1)
        if first is not None:  # the first block leads with the binding interval (swapped with whatever was there)
            lead = order[0].clone()
            pos = int((lead == first).nonzero())
            lead[0], lead[pos] = lead[pos].clone(), lead[0].clone()
            order[0] = lead
        which[rows] = order.reshape(-1)[:rows.numel()]
    if judged is not None:  # its own stream: every other draw of the set stays as it was
        which = free_one_sequence(which, a, judged, k, largest, case, gen.initial_seed())
    u = torch.rand(sign.shape[0], generator=gen, dtype=torch.float64)
    return _log_uniform(which, u, intervals)


def draw_row_log_ratios(batch: int, seq: int, intervals: list[tuple[float, float]],
                        gen: torch.Generator, binding: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:
    """[batch, seq] log-ratios, each row in blocks of len(intervals) positions that each take every interval
    once, in a drawn order (log-uniform inside). So every row's first k positions, and any k positions of one
    block, span all k intervals: a right-padded row of at least k tokens (a trainer's mask, which the
    trainer-shaped probe gives) holds a token in every clip region whatever its advantage's sign. A draw
    spread over the whole batch left some rows without one: a kernel that drops the clip on a trainer's batch
    passed 1 run in ~450 (CI run 134's gallery failure; `tests/test_member_inputs_regions.py`). `binding`
    ({row: (position, interval)}): that interval swapped to that position inside the row's first block."""
    k = len(intervals)
    blocks = -(-seq // k)
    which = torch.rand(batch, blocks, k, generator=gen).argsort(-1).reshape(batch, blocks * k)[:, :seq]
    for row, (pos, interval) in (binding or {}).items():  # `binding_positions`: swapped inside the first block
        first = which[row, : min(k, seq)]
        where = (first == interval).nonzero().flatten()
        if pos < first.numel() and where.numel():
            q = int(where[0])
            first[q], first[pos] = first[pos].clone(), first[q].clone()
    u = torch.rand(batch, seq, generator=gen, dtype=torch.float64)
    return _log_uniform(which, u, intervals)


def host_to(t: torch.Tensor, device) -> torch.Tensor:
    """A tensor drawn on the host, on `device` without waiting for its queue (a copy from pinned memory:
    a pageable copy waits for the GPU to finish the generation queued before it)."""
    if torch.device(device).type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def old_logprobs_for(logp: torch.Tensor, keep: torch.Tensor, p: GrpoParameters, cfg: MemberInputs,
                     gen: torch.Generator, host: HostDraws) -> torch.Tensor:
    """float64 old log-probs on logp's device: logp - log r with r in every region, away from the
    boundaries (r drawn on the host from `gen`: the same draws on every device); at token level every row's
    blocks of positions span the regions (`draw_row_log_ratios`); at sequence level each sign of the advantages
    gets a sequence where the clip binds (`draw_signed_log_ratios`). `host.binding` ({row: position}): at token
    level the clip binds there for the row's advantage sign."""
    batch, seq = logp.shape
    intervals = ratio_intervals(p, cfg)
    if p.loss_type == "vespo":  # the weight depends on the sequence's *sum* of log-ratios: draw the sum
        return logp - host_to(vespo_log_ratios(keep, cfg, gen), logp.device)
    if p.importance_sampling_level == "sequence":
        judged = keep.any(-1) if host.drawn else None
        per_seq = draw_signed_log_ratios(host.advantages, intervals, gen, judged, host.case)
        noise = torch.randn(batch, seq, generator=gen, dtype=torch.float64) * cfg.sequence_noise
        kf = keep.to(torch.float64)
        noise = noise - (noise * kf).sum(-1, keepdim=True) / kf.sum(-1, keepdim=True).clamp_min(1.0) * kf
        log_r = per_seq[:, None] + noise
    else:
        top = len(intervals) - 1
        held = {row: (pos, top if float(host.advantages[row]) > 0 else 0) for row, pos in host.binding.items()}
        log_r = draw_row_log_ratios(batch, seq, intervals, gen, held)
        # a small-|A| row judged on a kept token that is neither clipped nor near one-hot (judged_rows.py)
        return logp - one_judged_token(host_to(log_r, logp.device), logp, keep, host.advantages, intervals,
                                       gen.initial_seed(), held)
    return logp - host_to(log_r, logp.device)


VESPO_SUM = (math.log(0.2), math.log(4.0))  # w_b = exp(sum of log-ratios): where phi(w) is far from 0 and 1


def vespo_log_ratios(keep: torch.Tensor, cfg: MemberInputs, gen: torch.Generator) -> torch.Tensor:
    """Per-token log-ratios whose masked sum per sequence is log-uniform in VESPO_SUM (so the gamma
    weight phi(w_b) is neither 0 nor 1 at any declared k, lambda), spread over the tokens with
    `sequence_noise` of masked sum 0. Token-level ratios drawn one by one would sum to |log w| ~ 10
    over a few dozen tokens: phi ~ 0 everywhere, nothing to tell a wrong weight from the right one."""
    batch, seq = keep.shape
    kf = keep.to(torch.float64)
    n = kf.sum(-1, keepdim=True).clamp_min(1.0)
    lo, hi = VESPO_SUM
    total = lo + torch.rand(batch, 1, generator=gen, dtype=torch.float64) * (hi - lo)
    noise = torch.randn(batch, seq, generator=gen, dtype=torch.float64) * cfg.sequence_noise
    noise = noise - (noise * kf).sum(-1, keepdim=True) / n * kf
    return total / n + noise


TIE_FRACTION = 0.125  # of the tokens whose sampling ratio sits exactly on a float32-exact cap


def sampling_ratios(shape: tuple[int, int], cap: float, cfg: MemberInputs, gen: torch.Generator) -> torch.Tensor:
    intervals = [(cfg.sampling_ratio_min, cap * (1 - cfg.boundary_margin)),
                 (cap * (1 + cfg.boundary_margin), cap * cfg.sampling_ratio_max_factor)]
    n = shape[0] * shape[1]
    return torch.exp(draw_log_ratios(n, [iv for iv in intervals if iv[1] > iv[0]], gen)).view(shape)


def sequence_sampling_ratios(keep: torch.Tensor, cap: float, cfg: MemberInputs, gen: torch.Generator,
                             advantages: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token sampling ratios whose product over each sequence's kept tokens (TRL's sequence modes)
    is a drawn q_b on either side of the cap, `boundary_margin` away from it; the tokens spread around
    q_b^(1/n_b) (per-token log spread `sequence_noise`, kept sum 0), masked tokens anywhere. With `advantages`,
    a sequence of an ordinary |A| (above advantages.SMALL_MAX) is below the cap where the draw put none there
    (values swapped, no draw): in the sequence-mask mode a set whose ordinary sequences were all masked held only
    its small and zero advantages, a deaf call (from batch 4 every set holds a zero)."""
    batch, seq = keep.shape
    intervals = [(cfg.sampling_ratio_min, cap * (1 - cfg.boundary_margin)),
                 (cap * (1 + cfg.boundary_margin), cap * cfg.sampling_ratio_max_factor)]
    per_seq = draw_log_ratios(batch, [iv for iv in intervals if iv[1] > iv[0]], gen)
    if advantages is not None and advantages.numel() == batch:
        loud = (advantages.detach().to("cpu", torch.float64).reshape(-1).abs() > SMALL_MAX) & keep.any(-1).cpu()
        below = per_seq < math.log(cap)
        if bool(loud.any()) and not bool((loud & below).any()) and bool(below.any()):
            i, j = int(torch.nonzero(loud)[0]), int(torch.nonzero(below)[0])
            per_seq[[i, j]] = per_seq[[j, i]]
    kf = keep.to(torch.float64)
    n = kf.sum(-1, keepdim=True).clamp_min(1.0)
    noise = torch.randn(batch, seq, generator=gen, dtype=torch.float64) * cfg.sequence_noise
    noise = noise - (noise * kf).sum(-1, keepdim=True) / n * kf
    masked = torch.log(sampling_ratios((batch, seq), cap, cfg, gen))
    return torch.exp(torch.where(keep, per_seq[:, None] / n + noise, masked))


def fill_member_inputs(spec: Spec, rw: ResolvedWorkload, tensors: dict[str, torch.Tensor], seed: int,
                       values: Mapping[str, Any] | None = None, case: int | None = None,
                       found: dict[str, Any] | None = None,
                       given: Mapping[str, torch.Tensor] | None = None,
                       host: HostDraws | None = None) -> dict[str, list[str]]:
    """Write the member's optional inputs into `tensors` (in place), given the logits, ids and advantages
    already there. `values` are the call's parameter values (default: the spec's); `case` the index of
    this input set in its workload (generators.masks rotates the mask layouts with it). Returns what
    the set covered (the mask's row layouts and dtype). `found` receives `logp`, the float64 log-probs
    of these logits at the call's temperature, where they were computed (the judging reuses them). A mask in
    `given` (`check_given`) is written as it is, and the log-probs are drawn for it. `host`: the advantages
    on the host (read back from `tensors` where not passed) and the binding positions."""
    names = [t.name for t in spec.inputs if t.name in OPTIONAL_INPUTS]
    covered: dict[str, list[str]] = {}
    if not names:
        return covered
    p = GrpoParameters.from_spec(spec, values)
    cfg = _cfg(spec)
    gen = torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1))
    batch, seq = tensors["completion_ids"].shape
    keep = torch.ones(batch, seq, dtype=torch.bool)
    if "completion_mask" in tensors:
        keep = fill_completion_mask(tensors["completion_mask"], rw, cfg, gen, case, given, tensors["advantages"])
        covered["mask_layouts"] = sorted(set(classify(keep)))
        covered["mask_dtypes"] = [dtype_name(tensors["completion_mask"].dtype)]
    logp = None
    if "old_logprobs" in tensors or "ref_logprobs" in tensors:
        logp = reference_logprobs(tensors, p)  # on the logits' device: nothing here waits for it
        if found is not None:
            found["logp"] = logp
    if "old_logprobs" in tensors:
        host = host or HostDraws(tensors["advantages"].detach().cpu().reshape(-1),
                                 drawn="advantages" not in (given or {}), case=case)
        tensors["old_logprobs"].copy_(old_logprobs_for(logp, keep, p, cfg, gen, host).to(tensors["old_logprobs"].dtype))
    if "ref_logprobs" in tensors:
        sign = torch.sign(tensors["advantages"].detach().to(logp.device, torch.float64))
        coin = host_to(torch.where(torch.rand(batch, generator=gen) < 0.5, -1.0, 1.0).double(), logp.device)
        sign = torch.where(sign == 0, coin, sign)
        gap = cfg.ref_gap_min + torch.rand(batch, seq, generator=gen, dtype=torch.float64) * (cfg.ref_gap_max - cfg.ref_gap_min)
        ref = logp + sign[:, None] * host_to(gap, logp.device)
        tensors["ref_logprobs"].copy_(ref.to(tensors["ref_logprobs"].dtype))
    if "sampling_ratio" in tensors:
        cap = p.sampling_ratio_cap if p.sampling_ratio_cap is not None else 3.0
        if p.vllm_importance_sampling_mode.startswith("sequence"):
            ratios = sequence_sampling_ratios(keep, cap, cfg, gen, tensors["advantages"])
        else:
            ratios = sampling_ratios((batch, seq), cap, cfg, gen)
            if float(torch.tensor(cap, dtype=torch.float32)) == cap:
                # A cap float32 holds exactly (TRL's 3.0, an integer end of the range): some tokens exactly on
                # it, where "q <= cap keeps it" decides and a float32 kernel agrees with the float64
                # reference; a kernel testing q < cap was accepted (adversarial round, 2026-12-05).
                tie = torch.rand(batch, seq, generator=gen) < TIE_FRACTION
                ratios = torch.where(tie, torch.full_like(ratios, cap), ratios)
                covered["input_ties"] = ["sampling ratio at the cap"] if bool(tie.any()) else []
        tensors["sampling_ratio"].copy_(ratios.to(tensors["sampling_ratio"].dtype))
    return covered


def exact_rows(logits: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A copy of `logits` whose scored rows make logp exactly 0 in any floating arithmetic: the target
    logit is a small integer and every other one is EXACT_GAP below it (exp underflows to nothing
    against 1, in float32 as in float64, for temperatures up to ~3)."""
    out = logits.clone()
    batch, seq_next, _ = out.shape
    seq = seq_next - 1
    top = torch.randint(-4, 5, (batch, seq), generator=gen).to(torch.float32).to(out.device)
    body = out[:, :seq, :]
    body.copy_((top - EXACT_GAP)[..., None].expand_as(body).to(out.dtype))
    body.scatter_(-1, ids.to(out.device).long().unsqueeze(-1), top.unsqueeze(-1).to(out.dtype))
    return out


def tie_rows(logits: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A copy of `logits` whose scored rows have two logits at exactly 0 (the target and one other
    token) and every other one EXACT_GAP below: p = 1/2 at the target (a gradient far from zero),
    and logp = -log(2) computed in float32 is fp32(-log 2) whatever the kernel's log-sum-exp
    (the sum of exp is exactly 2; log of a power of two reduces to e*ln2 in every libm, Triton's
    log and log2-based forms alike)."""
    out = logits.clone()
    batch, seq_next, vocab = out.shape
    seq = seq_next - 1
    body = out[:, :seq, :]
    body.fill_(-EXACT_GAP)
    target = ids.to(out.device).long().unsqueeze(-1)
    other = (target + 1 + torch.randint(0, max(1, vocab - 1), target.shape, generator=gen).to(out.device)) % vocab
    body.scatter_(-1, other, 0.0)
    body.scatter_(-1, target, 0.0)
    return out


TIE_OLD_LOGPROB = float(torch.tensor(-math.log(2.0), dtype=torch.float32))  # fp32(-log 2)

def _reference_ratios(x: Mapping[str, torch.Tensor], p: GrpoParameters) -> torch.Tensor:
    """The ratio r[b, t] as the reference computes it (float64, token or sequence level)."""
    logp = reference_logprobs(x, p)
    keep = (x["completion_mask"] != 0).to(logp.device) if "completion_mask" in x else torch.ones_like(logp, dtype=torch.bool)
    log_ratio = torch.where(keep, logp - x["old_logprobs"].to(torch.float64), torch.zeros_like(logp))
    if p.importance_sampling_level == "sequence":
        mf = keep.to(torch.float64)
        n = mf.sum(-1, keepdim=True).clamp_min(1.0)
        r = torch.exp((log_ratio * mf).sum(-1, keepdim=True) / n).expand_as(logp)
    else:
        r = torch.exp(log_ratio)
    return r[keep]


def tie_ref_logprobs(spec: Spec, out: dict[str, torch.Tensor], gen: torch.Generator,
                     logp: torch.Tensor | None = None) -> None:
    """out["ref_logprobs"] on `tie_rows` (logp = -log 2), or beside the float64 log-probs `logp` [B, S] where
    given, as fill_member_inputs draws them: each token's gap U[ref_gap_min, ref_gap_max] from logp, on its
    advantage's side (the KL term adds to the policy term)."""
    cfg = _cfg(spec)
    batch, seq = out["completion_ids"].shape
    sign = torch.sign(out["advantages"].detach().to("cpu", torch.float64))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    gap = cfg.ref_gap_min + torch.rand(batch, seq, generator=gen, dtype=torch.float64) * (cfg.ref_gap_max - cfg.ref_gap_min)
    ref = (-math.log(2.0) if logp is None else logp.to("cpu", torch.float64)) + sign[:, None] * gap
    out["ref_logprobs"].copy_(ref.to(out["ref_logprobs"].device, out["ref_logprobs"].dtype))


TIE_ADVANTAGE = 0.25  # the least |advantage| at an exact tie: a tie's gradient scales with it


def audible(advantages: torch.Tensor) -> torch.Tensor:
    """The advantages, each at least TIE_ADVANTAGE in magnitude, signs kept (0 taken as +): a drawn set may hold
    only tiny ones (its 'tiny' and 'exact-tiny' cases), whose tie gradient a float16 call's tolerance covers, so a
    kernel giving ties to the clipped branch passed about 1 run in 3 (other-dtypes-fp16-tie-to-clipped, thirty-seventh
    session). Tiny advantages are other calls' business; at a tie only the tie matters."""
    sign = torch.where(advantages < 0, -1.0, 1.0).to(advantages.dtype)
    return sign * advantages.abs().clamp(min=TIE_ADVANTAGE)


def exact_tie_inputs(spec: Spec, tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any], seed: int
                     ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Inputs and parameters where every token ties exactly (the `exact-ties` probe), with a
    gradient far from zero. On-policy members: epsilon = 0 (r is exactly 1 in any arithmetic).
    With old log-probs: `tie_rows` logits (p = 1/2 at the target) and old = fp32(-log 2), so a
    float32 kernel computes logp - old = 0 and r = 1 exactly; the float64 reference sees
    r64 = exp(-log 2 - old) = 1 + 2e-9, so epsilon_high = max(r64) - 1 and epsilon_low =
    max(0, 1 - min(r64)) (exact by Sterbenz) put r64 exactly on (or inside) the bounds, which a
    float32 kernel rounds to 1: a tie at both bounds for it, a tie for the reference. Under the
    spec's tie rule the gradient is the full -A*r one; a kernel that hands ties to the clipped
    branch returns 0 (the reference of a wide clip is the same gradient: tested). The advantages are made
    `audible` (at least TIE_ADVANTAGE in magnitude), so that gradient is never inside a narrow dtype's tolerance."""
    out = {k: v.clone() for k, v in tensors.items()}
    if "advantages" in out:
        out["advantages"] = audible(out["advantages"])
    params = dict(values)
    names = {p.name for p in spec.parameters}
    for name in ("epsilon_low", "epsilon_high"):
        if name in names:
            params[name] = 0.0
    if "old_logprobs" not in out:
        return out, params
    gen = torch.Generator().manual_seed((seed ^ _SALT ^ 0x7469) & (2**63 - 1))
    out["logits"] = tie_rows(out["logits"], out["completion_ids"], gen)
    out["old_logprobs"].fill_(TIE_OLD_LOGPROB)
    p = GrpoParameters.from_spec(spec, params)
    if "ref_logprobs" in out:
        tie_ref_logprobs(spec, out, gen)
    if p.loss_type == "cispo":
        params["epsilon_high"] = 1.0  # the cap at r: it is detached, so no branch to choose
        return out, params
    r = _reference_ratios(out, p)
    if r.numel():
        params["epsilon_high"] = max(0.0, float(r.max()) - 1.0)
        params["epsilon_low"] = max(0.0, 1.0 - float(r.min()))
        assert 1.0 + params["epsilon_high"] >= float(r.max()) and 1.0 - params["epsilon_low"] <= float(r.min())
    return out, params


def boundary_tie(tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any], side: str, seed: int,
                 ratio: float = 1.25) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Exact ties at r = 1 + epsilon_high (side "high") or 1 - epsilon_low ("low") as the float64
    reference sees them: exact rows (logp = 0), old = float32(-log ratio) for every token, and the
    epsilon set to exp(-old) - 1 (or 1 - exp(-old)) in float64, which makes 1 +- eps == exp(0 - old)
    exactly (Sterbenz). An fp32 kernel may round either way at such a tie: verdicts use
    `exact_tie_inputs` (epsilon = 0), this one pins the reference's branch (tests)."""
    if side not in ("high", "low"):
        raise ValueError("side is 'high' or 'low'")
    target = ratio if side == "high" else 1.0 / ratio
    out = {k: v.clone() for k, v in tensors.items()}
    gen = torch.Generator().manual_seed((seed ^ _SALT ^ 0x6264) & (2**63 - 1))
    out["logits"] = exact_rows(out["logits"], out["completion_ids"], gen)
    old32 = torch.tensor(-math.log(target), dtype=torch.float32)
    out["old_logprobs"].fill_(float(old32))
    r64 = float(torch.exp(torch.tensor(-float(old32), dtype=torch.float64)))  # torch's exp, as the reference
    params = dict(values)
    if side == "high":
        params["epsilon_high"] = r64 - 1.0
        assert 1.0 + params["epsilon_high"] == r64
    else:
        params["epsilon_low"] = 1.0 - r64
        assert 1.0 - params["epsilon_low"] == r64
    return out, params


def tie_ratio(spec: Spec, x: Mapping[str, torch.Tensor], values: Mapping[str, Any]) -> float:
    """The largest ratio the float64 reference sees on `exact_tie_inputs`' tensors (every token's is
    the same there); 1.0 on-policy, where the ratio is exactly 1. `declared_cases.tie_value` puts a
    clip bound on it."""
    if "old_logprobs" not in x:
        return 1.0
    r = _reference_ratios(x, GrpoParameters.from_spec(spec, values))
    return float(r.max()) if r.numel() else 1.0
