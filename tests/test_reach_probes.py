"""The twenty-seventh session's probes on their own: reach's shapes and dtypes come from the declared domain and the
default workloads (checks/reach.py), one-input changes exactly one input at its end (ops/one_input.py). The
gallery folders reach-*, fused-reach-*, fused-cache-by-prefix, fused-zero-row-as-padding,
fused-reference-weight-ignored and one-sign-fast-path fail them through the validator (tests/test_gallery.py)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_conform.checks import member_calls
from grpo_conform.checks.reach import KEPT, reach_mask
from grpo_conform.ops.grpo_probes import REACH_CAP, REACH_FLOOR, REACH_FLOOR_CUDA, REACH_FLOOR_PER_ROW_CPU, REACH_SMALL
from grpo_conform.ops.one_input import change_end
from grpo_conform.spec import find_spec
from in_process import load_module


def _run(spec_id: str, seed: int, device: str = "cpu"):
    spec = find_spec(spec_id)
    lead = spec.differentiable_input
    return SimpleNamespace(spec=spec, rng=random.Random(seed), device=torch.device(device),
                           grad_dtype=lead.dtypes[0])


def _lead(shape: dict[str, int], spec_id: str, device: str) -> str:
    floors = {**REACH_FLOOR, **(REACH_FLOOR_CUDA if device == "cuda" else {})}
    if device != "cuda" and spec_id.startswith("grpo-fused-linear"):
        floors.update(REACH_FLOOR_PER_ROW_CPU)
    (lead,) = [a for a, v in shape.items() if v >= floors[a]]  # exactly one axis reached a call
    return lead


@pytest.mark.parametrize("spec_id", ["grpo/sapo-mask", "grpo/token-is", "grpo-fused-linear/bnpo-mask"])
@pytest.mark.parametrize("seed", range(5))
def test_each_free_axis_is_reached_past_the_floor_and_every_default_workload_odd(spec_id, seed):
    """Past twice every default workload's size, or at the cap where that is larger (token-is runs V 128256 on the CPU)."""
    run = _run(spec_id, seed)
    shapes = member_calls.reach_axes(run.spec, run.device.type, run.rng)
    defaults = run.spec.workloads_for("cpu")
    free = [a.name for a in run.spec.axes if a.derivation() is None]
    assert len(shapes) == len(free)
    assert {_lead(sh, spec_id, "cpu") for sh in shapes} == set(free)  # every free axis in a call of its own
    for shape in shapes:
        assert set(shape) == set(free)
        lead = _lead(shape, spec_id, "cpu")
        value = shape[lead]
        largest = max(w.axes[lead] if isinstance(w.axes[lead], int) else w.axes[lead].max for w in defaults)
        assert value > min(2 * largest, REACH_CAP[lead]) and value <= REACH_CAP[lead] + 7, (lead, value)
        assert value % 2 == 1 and value & (value - 1) != 0, (lead, value)
        for axis, v in shape.items():
            if axis != lead:
                assert v <= max(REACH_SMALL[axis]), (lead, axis, v)  # the others stay small


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("seed", range(4))
def test_the_floors_cross_the_sizes_where_kernels_switch(device, seed):
    """Vocabulary past 16-bit ids; hidden past every block of 512-4096 by a quarter of a block or more (the
    thirty-seventh round's split-K of 2048 passed 1279); batch past trainer micro-batches of 256 (an advantage tile
    of 64 read at b % 64 passed 47); rows past 1024 in one sequence and, for the logits operation everywhere and
    the fused one on CUDA, two or three sequences past 16384 rows (chunk-local advantage indices, per-tile partials
    shared across sequences, repeat for repeat_interleave: all exact at batch 1), the fused one on the CPU two
    sequences past 2048 rows (a sequence's log-ratio summed per flat chunk of 2048, advantages indexed chunk-locally
    in chunks of 1024: every member since the forty-fourth session); on CUDA rows past 65535."""
    for spec_id in ("grpo-fused-linear/bnpo-mask", "grpo-fused-linear/sequence-offpolicy-mask",
                    "grpo/sequence-offpolicy-mask"):
        run = _run(spec_id, seed, device)
        by_lead = {_lead(sh, spec_id, device): sh for sh in member_calls.reach_axes(run.spec, device, run.rng)}
        assert by_lead["vocab"]["vocab"] > 2**17 and by_lead["batch"]["batch"] > 256
        seq = by_lead["seq"]
        assert seq["seq"] > 1024 and (seq["batch"] * seq["seq"] > 65535) == (device == "cuda")
        if device == "cpu" and "hidden" in seq:  # the fused operation interpreted: a chunk of 2048 splits the second
            assert seq["batch"] == 2 and seq["seq"] > 1024 + 63 and seq["batch"] * seq["seq"] > 2048 + 127
        else:
            assert 2 <= seq["batch"] <= 3 and seq["batch"] * seq["seq"] > 16384
        if "hidden" in by_lead:
            h = by_lead["hidden"]["hidden"]
            assert h > 4096 and all(h % block >= 255 for block in (512, 1024, 2048, 4096, 8192)), h
    assert "seq" in REACH_FLOOR_CUDA


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("spec_id", ["grpo/sapo-mask", "grpo-fused-linear/dapo-mask"])
def test_the_aligned_call_divides_every_axis_by_its_tiles(spec_id, device):
    """The corner every other CPU size avoids (thirty-sixth session): rows 128, vocabulary and hidden multiples of
    their range's low end (512 and 64 on the fused operation, 4096 on the logits one), so a last tile `size % TILE`
    wide is empty for every tile up to there; drawn, not one shape."""
    spec = find_spec(spec_id)
    fused = "hidden" in [a.name for a in spec.axes]
    calls = member_calls.reach_calls(spec, device, "bfloat16")
    wide = not (fused and device == "cpu")
    every = len(spec.differentiable_input.dtypes)
    assert [c.lead for c in calls] == (member_calls.free_axes(spec) + [member_calls.WIDE] * wide + [member_calls.ALIGNED]
                                       + [member_calls.LOW] * every + [member_calls.BLOCKS] * every * wide
                                       + [member_calls.SEQ_ALIGNED] * wide + [member_calls.ROWS_HALF] * (not wide))
    aligned = [c for c in calls if c.lead == member_calls.ALIGNED]
    assert [c.dtype for c in aligned] == ["bfloat16"]  # the member's own
    seen = set()
    for seed in range(40):
        a = member_calls.aligned_axes(spec, device, random.Random(seed))
        assert a["batch"] * a["seq"] == 128 and a["batch"] in (2, 4, 8)
        assert a["vocab"] % (512 if fused else 4096) == 0 and a["vocab"] <= (4096 if fused else 32768)
        assert not fused or (a["hidden"] % 64 == 0 and a["hidden"] <= 512)
        seen.add(tuple(a.values()))
    assert len(seen) > 10


def test_past_blocks_moves_a_value_off_every_block_s_first_elements():
    assert member_calls.past_blocks(8193, 255) == 8447  # twice the CUDA workloads' hidden 4096, plus one
    assert member_calls.past_blocks(5375, 255) == 5375 and member_calls.past_blocks(263, 0) == 263


def test_the_reach_mask_varies_along_a_long_row_and_keeps_every_row():
    keep = reach_mask((3, 4099), torch.int64, 7)
    assert keep.dtype == torch.int64 and (keep[:, -1] == 1).all()
    share = float(keep.float().mean())
    assert abs(share - KEPT) < 0.03
    tiles = keep[:, :4096].reshape(3, 4, 1024)
    assert (tiles.sum(-1) > 0).all() and not torch.equal(tiles[:, 0], tiles[:, 1])  # t % 1024 reads the wrong one
    assert not torch.equal(keep, reach_mask((3, 4099), torch.int64, 8))


def test_the_reach_mask_of_short_rows_is_not_every_token():
    # the fused operation's batch call on the CPU: one position a sequence. Every row's last token kept made it
    # all-ones, and a normaliser per chunk of 4 sequences was exact at a batch divisible by 4 (CI at 2e13295)
    keep = reach_mask((269, 1), torch.bool, 3)
    assert abs(float(keep.float().mean()) - KEPT) < 0.08
    counts = keep[:268].reshape(67, 4).sum(-1)
    assert len(set(counts.tolist())) >= 3  # chunks of 4 sequences keep different numbers of tokens
    for seed in range(300):  # never uniform: one token kept at least, one dropped at least
        for shape in ((2, 1), (3, 2), (1, 2)):
            m = reach_mask(shape, torch.bool, seed)
            assert m.any() and not m.all(), (shape, seed)
    assert reach_mask((1, 1), torch.int64, 0).item() == 1


def test_the_seq_aligned_call_s_mask_is_sparse_with_the_last_sequence_empty():
    from grpo_conform.checks.reach import SPARSE

    keep = reach_mask((3, 1024), torch.bool, 5, sparse=True)
    assert not keep[-1].any() and keep[:-1, -1].all()  # a trailing empty sequence; the others end kept
    assert abs(float(keep[:-1].float().mean()) - SPARSE) < 0.03


def test_the_batch_call_s_mask_makes_a_per_chunk_normaliser_audible():
    # the gallery folder CI let through: at one position a sequence and a batch divisible by 4, every token kept
    # made its per-chunk-of-4 normaliser equal the batch's (exactly, in float64); a drawn mask does not
    impl = load_module(Path(__file__).parent / "gallery" / "fused-reach-chunked-normaliser" / "impl.py", "chunked")
    per_token = torch.zeros(268, 1, dtype=torch.float64, requires_grad=True)

    def weights(keep):  # each token's weight in the loss: what its gradient row is scaled by
        (w,) = torch.autograd.grad(impl._reduce(per_token, keep, "bnpo", None), per_token)
        return w[keep] * keep.sum()  # 1 for every kept token where the normaliser is the batch's

    for seed in range(20):
        assert float((weights(reach_mask((268, 1), torch.bool, seed)) - 1).abs().max()) > 0.3, seed
    assert torch.allclose(weights(torch.ones(268, 1, dtype=torch.bool)), torch.ones(268, dtype=torch.float64))


def test_the_free_axis_calls_take_the_dtype_order_turned_by_the_member_and_the_process(monkeypatch):
    """The free-axis calls take the unused dtypes then the member's own, in turn, starting at the member's family index
    plus the run's number (`member_calls.member_turn`); the low and vocabulary-blocks calls meet every dtype."""
    monkeypatch.setattr(member_calls, "RUN_TURN", 0)
    masked = find_spec("grpo/sapo-mask")  # default CPU workloads: bfloat16 only
    order = ["float16", "float32", "bfloat16"]
    turn = member_calls._family_names(masked.source).index("sapo-mask")
    assert member_calls.member_turn(masked) == turn
    every = ["bfloat16", "float16", "float32"]  # the low and vocabulary-blocks calls, each in every declared dtype
    free = [order[(i + (0 if i == 1 else turn)) % 3] for i in range(3)]  # batch, seq (float32: seq-aligned), vocab
    assert [c.dtype for c in member_calls.reach_calls(masked, "cpu", "bfloat16")] == free + [
        "bfloat16", "bfloat16"] + every * 2 + ["bfloat16"]  # wide and aligned, low, blocks, seq-aligned: their own


def test_every_free_axis_call_meets_every_dtype_across_three_members_and_across_runs(monkeypatch):
    """The blind spot it closes: with one fixed order the fused operation's vocabulary call on the CPU was float16 for
    every member, so a kernel wrong in bfloat16 past a 4096-wide vocabulary passed every run. The rows call keeps
    float32 for every member (`ROWS_FIXED`); on the CPU the fused operation's second rows call (`ROWS_HALF`) brings
    long rows in bfloat16 and float16 in turn, so any two consecutive members meet both, for every member."""
    names = member_calls._family_names(find_spec("grpo-fused-linear/token-is").source)
    assert "sequence-offpolicy-mask" in names  # the sequence-level member has the half rows call too
    for turn in (0, 1, 2, 12345):
        monkeypatch.setattr(member_calls, "RUN_TURN", turn)
        for first in range(len(names) - 2):
            met: dict[str, set[str]] = {}
            for name in names[first:first + 3]:
                calls = member_calls.reach_calls(find_spec(f"grpo-fused-linear/{name}"), "cpu", "bfloat16")
                assert [c.dtype for c in calls if c.lead == "seq"] == ["float32"], (turn, name)
                assert len([c for c in calls if c.lead == member_calls.ROWS_HALF]) == 1, (turn, name)
                for c in calls:
                    met.setdefault(c.lead, set()).add(c.dtype)
            for lead in ("batch", "hidden", "vocab"):
                assert met[lead] == {"bfloat16", "float16", "float32"}, (turn, names[first:first + 3], lead)
            assert met[member_calls.ROWS_HALF] == {"bfloat16", "float16"}, (turn, names[first:first + 3])
    fused = find_spec("grpo-fused-linear/token-is")
    seen, half = set(), set()
    for turn in range(3):
        monkeypatch.setattr(member_calls, "RUN_TURN", turn)
        calls = member_calls.reach_calls(fused, "cpu", "bfloat16")
        seen.add(next(c.dtype for c in calls if c.lead == "vocab"))
        half.add(next(c.dtype for c in calls if c.lead == member_calls.ROWS_HALF))
    assert seen == {"bfloat16", "float16", "float32"} and half == {"bfloat16", "float16"}  # one member, over runs


def test_the_half_rows_call_is_long_and_only_where_no_seq_aligned_call_runs(monkeypatch):
    """The second rows call holds two sequences past 1024 rows each, drawn apart from the first rows call, and runs for
    the fused operation on the CPU alone: the logits operation (any device) and the fused one on CUDA have the
    seq-aligned call, which brings 1024+ rows in the member's own dtype. The rows call stays float32 everywhere."""
    logits = member_calls._family_names(find_spec("grpo/token-is").source)
    fused = member_calls._family_names(find_spec("grpo-fused-linear/token-is").source)
    for turn in range(3):
        monkeypatch.setattr(member_calls, "RUN_TURN", turn)
        for n in logits:
            for device in ("cpu", "cuda"):
                calls = member_calls.reach_calls(find_spec(f"grpo/{n}"), device, "bfloat16")
                assert member_calls.ROWS_HALF not in {c.lead for c in calls}, (n, device)
                assert member_calls.SEQ_ALIGNED in {c.lead for c in calls}, (n, device)
                if n != "token-is":  # token-is declares its own dtype order
                    assert [c.dtype for c in calls if c.lead == "seq"] == ["float32"], (n, device)
        for n in fused:
            spec = find_spec(f"grpo-fused-linear/{n}")
            gpu = member_calls.reach_calls(spec, "cuda", "bfloat16")
            assert member_calls.ROWS_HALF not in {c.lead for c in gpu}
            assert [c.dtype for c in gpu if c.lead == "seq"] == ["float32"], n
            cpu = member_calls.reach_calls(spec, "cpu", "bfloat16")
            (rows,) = [c for c in cpu if c.lead == "seq"]
            (half,) = [c for c in cpu if c.lead == member_calls.ROWS_HALF]
            for c in (rows, half):
                assert c.axes["batch"] == 2 and c.axes["seq"] > 1024 and c.axes["seq"] % 2 == 1, (n, c)
            assert half.axes != rows.axes, n  # drawn apart: another size where a kernel might switch
            assert half is cpu[-1]  # last: every other call keeps its index, and with it its upstream kind and seed

def test_the_run_s_turn_reaches_its_slot_processes_through_the_environment(monkeypatch):
    """Slots of one run are processes of their own (gate/parallel.py: the parent's environment); a number drawn in
    each would turn members checked in different slots independently, and three consecutive members could all meet
    the vocabulary call in float32 (a CPU run of a three-member folder, two slots: two of three in float32)."""
    monkeypatch.setenv(member_calls.ENV_TURN, "4242")
    assert member_calls._run_turn() == 4242  # a slot: the run's number, from its environment
    monkeypatch.delenv(member_calls.ENV_TURN)
    drawn = member_calls._run_turn()  # the run's first process: drawn, and left for the processes it starts
    assert 0 <= drawn < 9973 and os.environ[member_calls.ENV_TURN] == str(drawn)
    assert member_calls._run_turn() == drawn


def test_reach_calls_are_drawn_per_member_from_the_process_secret(monkeypatch):
    """What compile-ahead compiles is what reach calls: the same member gives the same calls in this process,
    another member or another process's secret other ones."""
    sapo, dapo = find_spec("grpo/sapo-mask"), find_spec("grpo/dapo-mask")
    first = member_calls.reach_calls(sapo, "cuda", "bfloat16")
    assert member_calls.reach_calls(sapo, "cuda", "bfloat16") == first
    drawn = set()
    for secret in range(8):
        monkeypatch.setattr(member_calls, "SECRET", secret)
        drawn.add(tuple(tuple(c.axes.values()) for c in member_calls.reach_calls(sapo, "cuda", "bfloat16")))
        drawn.add(tuple(tuple(c.axes.values()) for c in member_calls.reach_calls(dapo, "cuda", "bfloat16")))
    assert len(drawn) > 8


def test_change_end_changes_one_input_at_its_end_only():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert change_end(mask, "mask", False, None)
    assert mask.tolist() == [[True, True, False], [False, False, False]]  # the last kept token masked
    assert not change_end(torch.zeros(2, 3, dtype=torch.int64), "mask", False, None)  # nothing kept: unchanged
    rows = torch.arange(12.0).reshape(2, 2, 3)
    assert change_end(rows, "sequence", True, None)
    assert rows[1, 1].tolist() == [6.0, 7.0, 8.0] and rows[1, 0].tolist() == [9.0, 10.0, 11.0]
    assert rows[0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]  # the first elements stay
    ids = torch.tensor([[4, 9, 9]])
    assert change_end(ids, "ids", False, 10) and ids.tolist() == [[4, 9, 0]]  # equal: the next id, modulo V
    lone = torch.tensor([0.5])
    assert change_end(lone, "sequence-scalar", False, None) and lone.item() != 0.5


@pytest.mark.parametrize("seed", range(6))
def test_below_draws_lie_strictly_between_the_domain_s_end_and_the_draws_and_are_drawn(seed):
    from grpo_conform.ops.grpo_logits.declared_cases import below_draws
    from grpo_conform.spec.draws import draw_for

    for member in ("grpo/dapo-global-mask", "grpo/vllm-is-mask", "grpo/vespo-mask", "grpo/token-offpolicy-mask-delta"):
        spec = find_spec(member)
        got = below_draws(spec, random.Random(seed))
        params = {p.name: p for p in spec.parameters}
        assert "temperature" in got
        for name, value in got.items():
            d, start = params[name].domain, draw_for(spec, name).min
            if params[name].type == "int" and start > d.min + 2:
                assert d.min + 2 <= value < start and value % 2 == 1, (name, value)
            elif params[name].type == "int":
                assert value == d.min + 1 and start == d.min, (name, value)
            else:
                assert d.min < value < start, (name, value)
    caps = {below_draws(find_spec("grpo/vllm-is-mask"), random.Random(s))["sampling_ratio_cap"] for s in range(6)}
    assert len(caps) > 1 and max(caps) <= 0.75  # drawn, not one value a kernel could recognise; always under 1


@pytest.mark.parametrize("seed", range(3))
def test_above_draws_calls_each_unbounded_count_alone_past_float16_s_range(seed):
    """A normaliser held in float16 passed with the draws' N <= 48 (gallery declared-above-draws-fp16-normaliser):
    each integer reaches past 4 x 65504 in a call of its own (together, N / P would cancel)."""
    from grpo_conform.ops.grpo_logits.declared_cases import ABOVE, above_draws, declared_calls

    spec = find_spec("grpo/dapo-global-accum-mask")
    counts = {"num_items_in_batch", "num_processes", "gradient_accumulation_steps", "steps_per_generation"}
    got = above_draws(spec, random.Random(seed))
    assert set(got) == counts | {"epsilon_low", "epsilon_high", "temperature"}
    assert all(4 * 65504 < got[n] < ABOVE[1] and got[n] % 2 == 1 for n in counts)
    calls = [c for c in declared_calls(spec, random.Random(seed)) if c.label.startswith("above-draws-")]
    defaults = dict(spec.parameter_values)
    assert len(calls) == 7
    for c in calls:  # one parameter past its draws, the others at their defaults
        moved = [n for n in defaults if c.values[n] != defaults[n]]
        assert moved == [c.label.removeprefix("above-draws-")]


@pytest.mark.parametrize("seed", range(20))
def test_above_draws_calls_each_float_past_its_draws(seed):
    """A hard clip reading an epsilon_high above 1 as CISPO's raw bound passed every draw (0.1-0.35; gallery
    epsilon-high-above-one-raw-bound): an unbounded float is called at 3-8 times its draws' top, a bounded one in
    the gap above them."""
    from grpo_conform.ops.grpo_logits.declared_cases import above_draws

    got = above_draws(find_spec("grpo/token-offpolicy-mask-kl"), random.Random(seed))
    assert 1.05 <= got["epsilon_high"] <= 2.8 and 6.6 <= got["temperature"] <= 17.6 and 0.6 <= got["beta"] <= 1.6
    assert 0.3 < got["epsilon_low"] < 1.0  # the domain [0, 1): inside the gap above the draws' 0.3
    assert above_draws(find_spec("grpo/cispo-mask"), random.Random(seed))["epsilon_high"] >= 18.0  # its draws: 2-6


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("spec_id", ["grpo/vllm-is-mask", "grpo-token-is", "grpo-fused-linear/dapo-mask"])
def test_the_wide_vocabulary_call_goes_past_2_18_with_few_rows(spec_id, device):
    """Gemma 3's vocabulary is 262208: the vocabulary call stays at most 2^18 (REACH_CAP), the wide call goes past
    it, odd, drawn, with 4-6 rows (thirty-seventh session); the fused operation makes it on CUDA only."""
    spec = find_spec(spec_id)
    calls = member_calls.reach_calls(spec, device, "bfloat16")
    wide = [c for c in calls if c.lead == member_calls.WIDE]
    if "hidden" in member_calls.free_axes(spec) and device == "cpu":
        assert not wide
        return
    assert len(wide) == 1 and wide[0].dtype == "bfloat16"
    assert max(c.axes["vocab"] for c in calls if c.lead == "vocab") <= 2 ** 18 + 7
    seen = set()
    for seed in range(40):
        a = member_calls.wide_axes(spec, device, random.Random(seed))
        assert 2 ** 18 < a["vocab"] < 2 ** 18 + 2 ** 14 and a["vocab"] % 2 == 1
        assert 4 <= a["batch"] * a["seq"] <= 6
        seen.add(a["vocab"])
    assert len(seen) > 30
