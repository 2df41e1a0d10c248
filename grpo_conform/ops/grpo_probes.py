"""Probes of the GRPO family that every GRPO operation shares (issue 30): they change the `advantages`
input (one scalar per sequence), which grpo-logits and grpo-fused-linear both take, so they live beside
the shared [batch, seq] terms (`grpo_terms.py`) rather than in the generic engine. The probe registry
(`checks/probes.py`) lists them in its order; the engine is handed them like any other probe.

negated-advantages writes the advantages negated in place (call C, judged for freshness against the
reference); zero-advantage sets one sequence's advantage to exactly 0 (call E) and wants an exactly zero
gradient for that sequence in every gradient with a row per sequence (members without a KL term), then every
advantage (call E-all, every member: the reference's result, exactly 0 without a KL term). Call E moved from
`checks/probes.py` and `checks/judging.py`. trainer-shaped (since the adversarial round of 2026-12-05)
writes the advantages (and the mask) as a trainer makes them.
"""

from __future__ import annotations

import torch

from grpo_conform.checks import judging as J
from grpo_conform.checks.conformance import CALL, PLAIN, Probe, WorkloadConformance
from grpo_conform.compare import describe_outputs
from grpo_conform.ops.grpo_logits.member_inputs import largest_by_sign
from grpo_conform.ops.grpo_near_reference import near_reference
from grpo_conform.ops.grpo_padded import padded_batch
from grpo_conform.spec import Spec


def negated(run: WorkloadConformance) -> None:
    """C: the advantages negated, written in place (same addresses as A)."""
    P = run.P
    P.tensors["advantages"].neg_()
    P.commit()
    c = run.call("C", P, run.out1, ("freshness", "finite", "no-mutation", "no-aliasing"))
    if c is not None:
        J.fresh(run, c, "in place, same addresses")
        J.finite(run, c)
        run.state["C"] = (c, run.out1.name)
    if "A" in run.state:
        J.reread_first(run, "after C")


def zero_advantage(run: WorkloadConformance) -> None:
    """E: D's inputs with one sequence's advantage set to exactly 0 (members without a KL term, whose
    gradient there is exactly 0); E-all: D's inputs with every advantage exactly 0 (every member)."""
    if not run.Q.drawn:  # a pass where nothing drew D's set (other-dtypes: no baseline there): drawn here
        run.generate(run.Q, run.seeds[1 % len(run.seeds)] ^ 0xE0)
    c = run.state.get("D", (None, None, 1.0))[2]
    if without_kl(run.spec) is None:
        judge_zero_advantage(run, c)
    judge_all_zero(run, c)
    judge_all_equal(run, c)


def judge_zero_advantage(run: WorkloadConformance, c: float) -> None:
    Q = run.Q
    b = live_row(run, Q)
    run.draws["zero_advantage_sequence"] = b
    original = Q.tensors["advantages"].clone()
    Q.tensors["advantages"][b] = 0.0
    Q.commit()
    e = run.call("E", Q, run.out1, ("zero-advantage", "finite", "no-mutation", "no-aliasing"), upstream=c)
    if e is not None:
        J.finite(run, e)
        # the gradients with a row per sequence (logits; hidden): sequence b's must be exactly 0
        per_sequence = [n for n in e.grads if run.spec.input(n).shape[0] == "batch" and e.grad_descs.get(n)]
        nonzero = sum(int((e.grads[n][b] != 0).sum()) for n in per_sequence)
        loss_cmp, cmp = run.judge(e)
        ok = nonzero == 0 and cmp.passed and loss_cmp.passed
        msg = (f"advantage[{b}] = 0 gives an exactly zero gradient for sequence {b}" if ok else
               f"advantage[{b}] = 0: {nonzero} non-zero gradient values in sequence {b}" if nonzero else
               "the other sequences do not match the reference: " + describe_outputs(loss_cmp, cmp))
        run.book.record("zero-advantage", e.label, ok, msg, {"sequence": b, "nonzero": nonzero,
                                                             "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})
    Q.tensors["advantages"].copy_(original)
    Q.commit()


def judge_all_zero(run: WorkloadConformance, c: float) -> None:
    """E-all: every advantage exactly 0, as a micro-batch whose groups all tied (every completion solved, or
    none) hands over. The drawn sets always mix signs and E zeroes one sequence only, so a kernel that returns
    a zero loss and zero gradients for such a batch (no learning signal: skip it) passed, dropping a KL term
    that still pulls toward the reference (adversarial round, `kl-skipped-when-no-advantage`,
    `fused-all-zero-advantages-early-exit`). Judged against the reference: the KL term's loss and gradient
    where the member has one; elsewhere the reference is exactly 0 and so must every gradient be, as E asks.
    A kernel that recognises the call gains nothing: its inputs are a trainer's tied batch (D's other inputs,
    which no call marks), and the only way to pass is the reference's answer for them. Members with given
    ref_logprobs then make E-near on the same set, those log-probs within 0.5 of the policy's
    (`grpo_near_reference.py`)."""
    Q = run.Q
    original = Q.tensors["advantages"].clone()
    Q.tensors["advantages"].zero_()
    Q.commit()
    run.draws["advantage_cases"] = sorted(set(run.draws.get("advantage_cases", ())) | {"all-zero"})
    e = run.call("E-all", Q, run.out1, ("zero-advantage", "finite", "no-mutation", "no-aliasing"), upstream=c)
    if e is not None and e.missing:  # a skipped batch whose loss autograd cannot differentiate
        run.book.record("zero-advantage", e.label, False, "every advantage 0: backward left no gradient on "
                        + ", ".join(e.missing), {"sequence": "all", "why": e.skipped_backward})
    elif e is not None:
        J.finite(run, e)
        exact = without_kl(run.spec) is None  # no KL term: the reference loss and gradients are exactly 0
        nonzero = sum(int((g != 0).sum()) for n, g in e.grads.items() if e.grad_descs.get(n)) if exact else 0
        loss_cmp, cmp = run.judge(e)
        ok = nonzero == 0 and cmp.passed and loss_cmp.passed
        what = "an exactly zero gradient" if exact else "the KL term's loss and gradient (the reference)"
        msg = (f"every advantage 0 gives {what}" if ok else
               f"every advantage 0: {nonzero} non-zero gradient values" if nonzero else
               "every advantage 0: " + describe_outputs(loss_cmp, cmp))
        run.book.record("zero-advantage", e.label, ok, msg, {"sequence": "all", "nonzero": nonzero,
                                                             "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})
    if run.spec.has_input("ref_logprobs"):  # E-near: the KL term alone, near the reference (grpo_near_reference.py)
        near_reference(run, c)
    Q.tensors["advantages"].copy_(original)
    Q.commit()


def judge_all_equal(run: WorkloadConformance, c: float) -> None:
    """E-equal: every advantage one drawn non-zero value (|A| 0.25-1.5, either sign), as a batch from one group
    whose rewards tied under a scheme that does not centre them, or advantages a trainer passes through. The drawn
    sets mix values and E-all's are all 0, so a kernel's "no learning signal" exit on `advantages.std() == 0`
    (right only when they are all 0) passed every default run (forty-second session's red team,
    `equal-advantages-policy-term-skipped`). Judged against the reference, as E-all; batch 1 is every call's case
    already and has no spread to lose, so the call needs two sequences or more."""
    Q = run.Q
    if Q.tensors["advantages"].numel() < 2:
        return
    r = run.rng
    value = r.choice((-1.0, 1.0)) * round(r.uniform(0.25, 1.5), 6)
    # Q as the calls before left it (buffers and pristine copies agree there): the probes after this one read it
    kept = Q.tensors["advantages"].clone()
    temperature = run.model.temperature
    try:
        before = run.slot_key(Q)
        Q.tensors["advantages"].fill_(value)
        Q.commit()
        run.refs.carry_logp(before, run.slot_key(Q), temperature)  # the advantages alone changed
        _judge_all_equal(run, c, value)
    finally:
        during = run.slot_key(Q)
        Q.tensors["advantages"].copy_(kept)
        Q.commit()  # a new version: the reference cache keys on it
        run.refs.carry_logp(during, run.slot_key(Q), temperature)


def _judge_all_equal(run: WorkloadConformance, c: float, value: float) -> None:
    Q = run.Q
    run.draws["advantage_cases"] = sorted(set(run.draws.get("advantage_cases", ())) | {"all-equal"})
    e = run.call("E-equal", Q, run.out1, ("zero-advantage", "finite", "no-mutation", "no-aliasing"), upstream=c)
    if e is None:
        return
    if e.missing:
        run.book.record("zero-advantage", e.label, False, f"every advantage {value}: backward left no gradient on "
                        + ", ".join(e.missing), {"sequence": "all", "value": value, "why": e.skipped_backward})
        return
    J.finite(run, e)
    loss_cmp, cmp = run.judge(e)
    ok = cmp.passed and loss_cmp.passed
    msg = (f"every advantage {value} gives the reference's result" if ok else
           f"every advantage {value}: " + describe_outputs(loss_cmp, cmp))
    run.book.record("zero-advantage", e.label, ok, msg, {"sequence": "all", "value": value,
                                                         "gradient": cmp.evidence(), "loss": loss_cmp.to_json()})


def one_sign(run: WorkloadConformance) -> None:
    """S+ and S-: fresh sets drawn given advantages all positive, then all negative (the same magnitudes). The
    drawn sets always hold both signs (a dropped sign must show), which left a batch of one sign unseen: a kernel
    taking a fast path when every advantage is negative (a group that all failed, after a baseline that is not
    their mean) passed every default run (the twenty-seventh session's adversarial round). Drawn given the
    advantages, so the other inputs suit them (the clip binds for their sign); not the set P holds by now, which
    earlier probes leave with ratios far out on one side. Once per worker process and member, at its first
    workload with two sequences or more."""
    batch = run.rw.axes["batch"]
    if batch < 2 or run.made_in("one_sign") is not None:
        return
    gen = torch.Generator().manual_seed(run.seeds[0] ^ 0x51C9)
    magnitudes = 0.1 + 1.4 * torch.rand(batch, generator=gen, dtype=torch.float64)
    for label, sign in (("S+", 1.0), ("S-", -1.0)):
        run.generate(run.P, run.seeds[0] ^ (0x51C0 + int(sign > 0)), given={"advantages": (sign * magnitudes).float()})
        call = run.call(label, run.P, run.out1, PLAIN)
        if call is not None:
            J.plain(run, call)


def mask_input(run: WorkloadConformance) -> str | None:
    """The name of the operation's mask input, or None (a member without one)."""
    return next((t.name for t in run.spec.inputs if run.op.input_kind(t.name) == "mask"), None)


def live_row(run: WorkloadConformance, slot) -> int:
    """A drawn row of `slot` with a kept token (any row where no input is a mask, or none is kept). A sequence
    whose every token is masked has a zero gradient whatever its advantage, so zeroing the advantage of one of
    the drawn masks' empty rows tested nothing: a masked kernel that revives zero advantages passed 4 runs of 12
    (`revives-zero-advantage-masked`)."""
    batch = run.rw.axes["batch"]
    mask = mask_input(run)
    rows = list(range(batch))
    if mask is not None:
        kept = (slot.tensors[mask] != 0).reshape(batch, -1).any(-1).tolist()
        rows = [i for i in rows if kept[i]] or rows
    return rows[run.rng.randrange(len(rows))]


def trainer_shaped(run: WorkloadConformance) -> None:
    """TS: an input set shaped as a GRPO trainer makes it, which the drawn sets avoid on purpose: advantages
    normalised within groups of completions, (r - mean) / (std + 1e-4), so every group sums to 0 (the drawn
    advantages keep a mean away from 0, so that a dropped sign shows), and every mask row a right-padded
    prefix of at least TRAINER_MIN_TOKENS tokens (TRL's masks; the drawn sets mix left padding, holes and
    empty rows), the largest |advantage| of each sign on a row of SPAN_TOKENS or more: drawn given these, the
    set makes the clip bind for both signs (`trainer_mask`, `member_inputs`), on the rows of the largest |A| of
    each sign, each with a binding token that is never near one-hot (`member_inputs.binding_positions`): in the
    gradient as well as in the loss.
    A kernel that takes a shortcut when it recognises a training batch fails here only. A second call
    (TS-lone) keeps the set and writes the advantages of `lone_success_slice`: values up to ~11.2. Members with a
    mask, once per worker process: TS-padded, a batch padded to its longest completion, hundreds of rows of which
    9-12% are kept (`grpo_padded.padded_batch`)."""
    K = run.K
    gen = torch.Generator().manual_seed(run.seeds[0] ^ 0x7EA2)
    adv = K.tensors["advantages"]
    batch = adv.shape[0]
    given = {}
    if batch >= 2:
        given["advantages"] = trainer_advantages(batch, gen).reshape(adv.shape)
        run.draws["advantage_cases"] = sorted(set(run.draws.get("advantage_cases", ())) | {"group-normalised"})
    mask = mask_input(run)
    if mask is not None:
        m = K.tensors[mask]
        given[mask] = trainer_mask(m.shape[0], m.shape[-1], gen, given.get("advantages"))
        run.draws["mask_layouts"] = sorted(set(run.draws.get("mask_layouts", ())) | {"trainer right-padded"})
    # drawn given the trainer's advantages and mask: the log-ratios make the clip bind for both signs
    run.generate(K, run.seeds[0] ^ 0x7EA1, given=given)
    t = run.call("TS-trainer", K, run.out1, PLAIN)
    if t is not None:
        J.plain(run, t)
    # TS-lone: the same input set, the advantages a slice of one large group holding its lone success, put on
    # the row of the largest negative trainer advantage, where a positive one is not clipped (`trainer_mask`,
    # `member_inputs.draw_signed_log_ratios`): its gradient shows the large advantage
    lone_row = largest_by_sign(given["advantages"]).get(-1) if "advantages" in given else None
    adv.copy_(lone_success_slice(batch, gen, lone_row).to(adv.dtype))
    run.draws["advantage_cases"] = sorted(set(run.draws.get("advantage_cases", ())) | {"lone-success"})
    K.commit()
    t = run.call("TS-lone", K, run.out1, PLAIN)
    if t is not None:
        J.plain(run, t)
    if mask is not None:
        padded_batch(run, mask, trainer_advantages)


# A trainer row keeps at least TRAINER_MIN_TOKENS tokens, as the probe always drew them (ones up to the first EOS);
# the row of the largest |advantage| of each sign keeps at least SPAN_TOKENS, the most ratio regions a member's
# clip boundaries cut (below 1 - eps_low, between, above 1 + eps_high, above delta): that prefix spans them all at
# token level (`member_inputs.draw_row_log_ratios`), so a kernel that drops a clip on a trainer's batch fails on
# every draw for either sign, while rows of two and three tokens stay in the set (with every row at two tokens
# or more and nothing held, the clip bound on no row in ~1 draw of 450).
TRAINER_MIN_TOKENS = 2
SPAN_TOKENS = 4
LONE_GROUPS = (32, 64, 128)  # the lone success's advantage: 5.48, 7.87, 11.21


def trainer_mask(batch: int, seq: int, gen: torch.Generator, advantages: torch.Tensor | None = None) -> torch.Tensor:
    """[batch, seq] bool: each row a right-padded prefix of TRAINER_MIN_TOKENS to seq kept tokens (all of a
    shorter row), the lengths drawn; with `advantages`, the row of the largest |A| of each sign keeps at least
    SPAN_TOKENS. The lengths are never all equal where the rows can differ: with equal lengths the normalisers
    (per sequence, per token, per batch) agree and no row is padded, so a kernel with a wrong normaliser, or a
    shortcut keyed on a padded prefix (`trl-shaped-mask`), passed ((1/11)^3 of draws at seq 12)."""
    least, span = min(TRAINER_MIN_TOKENS, seq), min(SPAN_TOKENS, seq)
    lengths = torch.randint(least, seq + 1, (batch,), generator=gen)
    held = torch.zeros(batch, dtype=torch.bool)
    if advantages is not None:
        for row in largest_by_sign(advantages).values():
            lengths[row] = max(int(lengths[row]), span)
            held[row] = True
    if batch >= 2 and seq > least and bool((lengths == lengths[0]).all()):
        if int(lengths[0]) < seq:  # all padded alike: one row becomes full (a longer row never breaks a hold)
            lengths[0] = seq
        else:  # all full: a row shortened, one not held to SPAN_TOKENS if there is one
            free = torch.nonzero(~held).squeeze(-1)
            row = int(free[0]) if free.numel() else 0
            lengths[row] = least if free.numel() else span
    return torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)


def trainer_advantages(batch: int, gen: torch.Generator) -> torch.Tensor:
    """[batch] float64 advantages of groups of 4 (else 2, else one group) completions with rewards in {0, 1, 2},
    group-normalised. Tied groups (all 0) stay possible, but never the first: a batch of one group (batch 4)
    was all zeros in 3 of 81 draws, a set no shortcut keyed on zero-sum advantages takes (the gallery's
    zero-mean-advantages then passed: 1 CI run in ~40)."""
    group = next(g for g in (4, 2, batch) if batch % g == 0)
    rewards = torch.randint(0, 3, (batch // group, group), generator=gen).double()
    if bool((rewards[0] == rewards[0, 0]).all()):
        rewards[0, 0] = (rewards[0, 0] + 1) % 3
    return group_normalised(rewards).reshape(batch)


def group_normalised(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO's advantages of each group (the last axis): (r - mean) / (std + 1e-4), TRL's scaling (unbiased std)."""
    return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-4)


def lone_success_slice(batch: int, gen: torch.Generator, row: int | None = None) -> torch.Tensor:
    """`batch` advantages cut from one group of G completions (drawn from LONE_GROUPS above the batch, else
    2 * batch: a workload a spec declares may hold more rows than the largest group) in which a
    single completion succeeded: a trainer whose group is larger than its micro-batch (generations split
    across steps) hands over such a slice. The success's normalised advantage is (G - 1) / sqrt(G) (TRL's
    unbiased std), far above what the drawn sets reach (~5 at most), and every other row gets -1 / sqrt(G);
    the success sits at `row`, else at a drawn row. A kernel that clamps or saturates large advantages is right
    everywhere else."""
    groups = [g for g in LONE_GROUPS if g > batch] or [2 * batch]
    group = groups[int(torch.randint(0, len(groups), (1,), generator=gen))]
    rewards = torch.zeros(group, dtype=torch.float64)
    rewards[0] = 1.0
    a = group_normalised(rewards)
    rows = a[1: batch + 1].clone()
    drawn = int(torch.randint(0, batch, (1,), generator=gen))  # drawn either way: the stream stays the same
    rows[drawn if row is None else row] = a[0]
    return rows


def small_axes(r, axes: dict[str, int]) -> dict[str, int]:
    """The small shape of the repeated-calls probe (`checks/patterns.py`), drawn from the run's `r` in this
    order: the GRPO family's axes, and for grpo-fused-linear (a `hidden` axis) the GEMM's inner size too."""
    small = {"batch": r.randint(1, 2), "seq": r.randint(1, 4), "vocab": r.randint(32, 160)}
    if "hidden" in axes:  # grpo-fused-linear: the GEMM's inner size too
        small["hidden"] = r.randint(8, 48)
    return small


#: the reach probe's shapes (checks/reach.py): the least value a reached axis takes, past the sizes where kernels
#: switch: tiles along a row (128-32768 positions or vocabulary entries), 16-bit token ids (vocabulary past
#: 2^16), hidden blocks of 512-4096 with a remainder, chunks of 1024 rows or 16-32 sequences (the twenty-eighth
#: session's round: docs/checks.md); on CUDA also rows past the 65535 a grid dimension holds (seq past 2^16 in
#: each sequence: cheap on a GPU, minutes for an interpreted kernel). The other axes of a reach call stay small
#: (REACH_SMALL), so one large axis costs what a small workload does.
#: Each floor is well past its threshold, not 1 past: a row of 1027 positions read the mask at t % 1024 wrongly
#: on 3 positions only, which matched by chance in 1 of 8 runs. Since the thirty-fifth session's round:
#: - batch past 256 (trainer micro-batches are 64-256 sequences): an advantage tile of 64 read at b % 64 passed 47+;
#: - rows past 17407 in two or three sequences (REACH_ROWS: 5803+ positions each): flat chunks of
#:   16384 tokens indexing advantages chunk-locally, per-tile partial sums of a sequence shared across the batch,
#:   and a large-rows path expanding advantages with repeat for repeat_interleave were all exact at batch 1;
#: - hidden 5375+ (real models run 3584-8192; the remainder is 1279+ past every block of 512-4096, so a dropped
#:   tail is a quarter of the GEMM, not 3 features of 4099, which a tolerance could absorb): split-K in blocks of
#:   2048 dropping the tail passed hidden 1279.
REACH_FLOOR = {"batch": 263, "seq": 1279, "vocab": 139265, "hidden": 5375}
#: the least rows (batch x seq) of the rows call, its seq raised to reach them at the batch drawn: 1023 past 16384
#: (a chunk of 16384 tokens misreads every row of the second chunk), and no more: rows are what the call costs
REACH_ROWS = 17407
REACH_FLOOR_CUDA = {"seq": 69631}
REACH_SMALL = {"batch": (2, 3), "seq": (2, 3), "vocab": (32, 96), "hidden": (8, 32)}
#: where a reached axis wants the others other than REACH_SMALL: the rows call has two or three sequences (a
#: bug that mixes sequences up is exact at batch 1, which this call had until the thirty-fifth session), the
#: batch call two or three positions a sequence (one or two before the forty-second session: chunks of 32 sequences
#: that read the mask at a flat offset c0 instead of c0 x T were exact at one). The fused operation's batch call keeps
#: one on the CPU (REACH_LEAD_SMALL_PER_ROW_CPU): its 263+ sequences are rows of its interpreted kernel, ~5-10 ms each
REACH_LEAD_SMALL = {"seq": {"batch": (2, 3), "vocab": (32, 48)}, "batch": {"seq": (2, 3)}}
#: the fused operation (an axis `hidden`) on the CPU: its Triton kernel runs interpreted there, one program a row
#: (~3.5 ms each on the 2-core machine), so its rows call holds two sequences of 1089-1095 (2178+ rows, 7.6 s for
#: triton-fused's forward and backward), not 16384+ (minutes a member). A fused kernel wrong only past 16384 rows is
#: caught on CUDA alone (REACH_FLOOR_CUDA: 2-3 sequences of 69631+ rows); the gallery's
#: fused-reach-large-rows-advantages-tiled is cuda_only for that reason.
#: Two sequences past 2048 rows, for every member: a flat chunk of 1024 or 2048 rows then splits a sequence (~960 /
#: ~130 for 2048) and holds rows of both, so a sequence's log-ratio summed per chunk (GSPO, thirty-sixth session,
#: `fused-gspo-rowchunk-2048`) and advantages indexed chunk-locally (`fused-reach-advantages-chunk-local-1024`,
#: forty-fourth session) are wrong there. Token-level members had one sequence of 1279+ until the forty-fourth
#: session (~3 s less a member of an interpreted CPU check), where a chunk-local index is exact.
REACH_FLOOR_PER_ROW_CPU = {"seq": 1087}  # 63+ positions past 1024 in each sequence (a mask read at t % 1024)
REACH_LEAD_SMALL_PER_ROW_CPU = {"seq": {"batch": (2, 2)}, "batch": {"seq": (1, 1)}}  # the batch call: 263+ rows
REACH_ROWS_PER_ROW_CPU = 2175  # 127 past 2048
#: the most a reached axis takes (past twice the largest default workload up to here)
REACH_CAP = {"batch": 288, "seq": 131072, "vocab": 262144, "hidden": 9216}
#: a reached axis's least remainder modulo every power of two from 512 up to it (`member_calls.past_blocks`): past twice
#: the CUDA workloads' hidden 4096 the draw was 8193-8199, where a split-K dropping its tail drops 1-7 features; the
#: vocabulary call's 139265-139271 left a log-sum-exp over 4096-wide blocks that skips the partial last block 1-7
#: columns short, often inside every allowance (docs/checks.md, "The reach calls' turn")
REACH_REMAINDER = {"hidden": 255, "vocab": 255}
#: reach's aligned call (member_calls.aligned_axes): every size above is odd, so a kernel whose last tile is
#: `size % TILE` wide (0 when TILE divides the size: the last full tile dropped) passed every CPU call, while real
#: models run V 32768/128256/262144 and H 2048-8192 (thirty-sixth session). Rows (batch x seq) REACH_ALIGNED_ROWS, a
#: power of two batch; vocabulary and hidden m x 2^k (m 1 or 3: tiles of 3 x 2^j too) in these ranges, each a
#: multiple of the range's low end. The fused operation's interpreted kernel pays per row and per vocabulary block
#: (128 rows at V 4096, H 512: 1.2 s; at V 32768: 4.4 s), the logits operation's little (V 32768: 0.4 s).
REACH_ALIGNED_ROWS = 128
REACH_ALIGNED_BATCH = (2, 8)
REACH_ALIGNED = {"vocab": (4096, 32768), "hidden": (64, 512)}
REACH_ALIGNED_FUSED = {"vocab": (512, 4096)}
#: reach's wide-vocabulary call (member_calls.wide_axes): the vocabulary call's floor sits past 2^17, its cap at 2^18,
#: but Gemma 3 runs V 262208, and a kernel switching path past 2^18 (a row no longer one block) passed every call
#: (thirty-sixth session's `large-vocab-path-backward-drops-temperature`); odd, drawn in this range, the other axes
#: REACH_WIDE_SMALL's: 4-6 rows in two or three sequences, since a row costs what the vocabulary does; not fewer:
#: with 1-4 a call's few kept tokens could all be clipped (no policy gradient: a dropped 1/T shows nowhere; one run
#: of ~14 of the gallery's case gave no failure line)
REACH_WIDE = {"vocab": (262145, 278527)}
REACH_WIDE_SMALL = {"batch": (2, 3), "seq": (2, 2), "hidden": (8, 16)}
#: reach's low call (member_calls.low_axes): the vocabulary and hidden size near the low end the spec declares (2+,
#: 1+), a few rows of a few sequences, in each declared dtype. Every other call's vocabulary was 32 or more, so a
#: one-warp-per-row path padding the lanes past V with 0 instead of -inf (a log-sum-exp over phantom logits below 32)
#: passed every default run (forty-second session's red team, gallery `tiny-vocab-warp-pad-zero`)
REACH_LOW = {"batch": (2, 4), "seq": (2, 5), "vocab": (2, 31), "hidden": (1, 7)}  # batch and seq 1: batch1-seq1
#: reach's vocabulary-blocks call (member_calls.blocks_axes): the vocabulary a multiple of 2^16 (Mistral's 131072,
#: Gemma's 262144), 4-6 rows as the wide call, in each declared dtype: the aligned call stops at 32768 and every
#: other large vocabulary is odd, so a vocabulary-parallel path in shards of 65536 that read the target logit
#: before 1/T passed (gallery `vocab-65536-shards-target-unscaled`), and float32 or float16 logits never met a
#: vocabulary past 65536 (the vocabulary calls run in the member's own dtype: gallery `fp32-real-vocab-chunk-lse-max`)
REACH_BLOCKS = {"vocab": (2, 4)}  # multiples of 2^16
REACH_BLOCK = 1 << 16
#: reach's seq-aligned call (member_calls.seq_aligned_axes): each sequence a multiple of 256 from 512 (trainers pad
#: completions to max_completion_length: 512-2048), two or three of them, the rows call's small vocabulary. Every
#: other long row was odd, so a per-sequence mean taken as the mean of per-256-token tile means passed every default
#: run (forty-second session's red team, gallery `even-seq-256-tile-means`). Not for the fused operation on the CPU
#: (its interpreted kernel pays ~3.5 ms a row: caught on CUDA, whose workloads' rows are aligned)
REACH_SEQ_ALIGNED = (2, 8)  # the sequence length: 256 x this
#: the axes whose reach calls go through torch.autograd.grad, the others through backward: rows and the
#: vocabulary are where kernels switch to a large-input path, and autograd.grad is the stricter read (a path
#: that added d weight into .grad itself and returned nothing passed every backward call)
REACH_AUTOGRAD = ("seq", "vocab", "vocab-wide", "low")
#: the axes whose reach call plants a peak in every row, the rows' peaks spread over the vocabulary (the operation's
#: `spread_peaks`): an online log-sum-exp that never rescales is then wrong on most rows of it, whatever order it
#: reads them in (generators/spread_peaks.py says why)
REACH_SPREAD_PEAKS = ("vocab", "vocab-wide")  # not vocab-blocks: a dominant peak hides a log-sum-exp of chunks
#: combined by max (one chunk holds the whole sum; gallery fp32-real-vocab-chunk-lse-max passed 1 run in ~10)
#: the row profiles of the vocabulary-blocks calls: 'normal' alone, whose rows spread their sum over every chunk of
#: 2^15-2^16 entries; a wide, large, peaked or heavy-tailed row is one logit's (the other vocabulary calls draw them),
#: and with them the folder above still passed 1 gallery run in 3
REACH_BLOCK_PROFILES = ("normal",)


def without_kl(spec: Spec) -> str | None:
    kl = {"ref_logprobs", "ref_weight"} & {t.name for t in spec.inputs}  # given reference log-probs or a reference lm_head
    return "the KL term gives a sequence of zero advantage a gradient" if kl else None


NEGATED_ADVANTAGES = Probe("negated-advantages", negated.__doc__, negated, CALL + ("freshness", "finite"),
                           needs=("baseline",))
ZERO_ADVANTAGE = Probe("zero-advantage", zero_advantage.__doc__, zero_advantage, CALL + ("zero-advantage", "finite"),
                       ("zero-advantage",), needs=("new-buffers",))
ONE_SIGN = Probe("one-sign", one_sign.__doc__, one_sign, PLAIN + CALL)
TRAINER_SHAPED = Probe("trainer-shaped", trainer_shaped.__doc__, trainer_shaped, PLAIN + CALL)
