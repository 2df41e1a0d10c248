"""Declared cases (issue 27 items 1 and 6): the calls derived from the spec's declarations, the exact
ties they build, the spec checks of `cases`, and the coverage a record carries and `verify` requires."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

from grpo_conform.ops.grpo_logits.declared_cases import (declared_calls, declared_names, merge_exercised, parameter_ends, tie_value,
                                         workload_exercised)
from grpo_conform.evidence import Policy
from grpo_conform.ops.grpo_logits.member_inputs import exact_tie_inputs, tie_ratio
from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient
from grpo_conform.spec import SpecError, load_family, load_spec, resolve_member_document, validate_document
from conftest import GALLERY
from test_evidence_support import make_project, make_trust_root, new_key, signed_record, statement_for, verify

PROJECT_ROOT = GALLERY.parent.parent
FAMILY = PROJECT_ROOT / "specs" / "grpo.v1.json"


def _member(name):
    return load_family(FAMILY).member(name)


def test_defaults_and_range_ends_come_from_the_declarations():
    spec = _member("token-offpolicy-mask-delta")
    calls = {c.label: c for c in declared_calls(spec, random.Random(1))}
    assert calls["defaults"].values["temperature"] == 1.0  # the value random draws avoid
    assert calls["defaults"].values["epsilon_low"] == calls["defaults"].values["epsilon_high"] == 0.2
    low, high = calls["all-min"].values, calls["all-max"].values
    assert (low["epsilon_low"], low["epsilon_high"], low["temperature"], low["delta"]) == (0.0, 0.0, 0.45, 1.3)
    assert (high["epsilon_low"], high["epsilon_high"], high["temperature"], high["delta"]) == (0.3, 0.35, 2.2, 2.0)
    assert calls["tie at delta"].tie.parameter == "delta"
    eq = calls["epsilon_low == epsilon_high"].values
    assert eq["epsilon_low"] == eq["epsilon_high"] and 0.1 <= eq["epsilon_low"] <= 0.3
    assert abs(eq["epsilon_low"] - 0.2) >= 0.1 * 0.2  # away from the default the defaults call covers


def test_a_new_member_gets_its_cases_from_its_declaration_alone():
    doc = json.loads(FAMILY.read_text())
    member = copy.deepcopy(next(m for m in doc["members"] if m["name"] == "token-offpolicy-mask-delta"))
    member["name"] = "new-member"
    member["cases"] = [{"name": "trainer pair", "values": {"epsilon_low": 0.1, "epsilon_high": 0.28}}]
    doc["members"].append(member)
    resolved = resolve_member_document(doc, "new-member", FAMILY)
    validate_document(resolved, FAMILY)
    from grpo_conform.spec import spec_from_document

    spec = spec_from_document(resolved, FAMILY)
    names = declared_names(spec)
    assert names["values"] == ["trainer pair"] and "ties" not in names
    assert "delta=max" in names["boundaries"] and "delta=default" in names["defaults"]


@pytest.mark.parametrize("case, problem", [
    ({"name": "x", "values": {"beta": 0.1}}, "does not declare"),
    ({"name": "x", "values": {"epsilon_low": 1.5}}, "outside the parameter's domain"),
    ({"name": "x", "tie": {"parameter": "loss_type", "bound": "value"}}, "not a drawn float"),
])
def test_bad_cases_are_spec_errors(case, problem):
    doc = json.loads(FAMILY.read_text())
    doc["common"]["cases"] = [case]
    with pytest.raises(SpecError, match=problem):
        validate_document(resolve_member_document(doc, "token-offpolicy-mask", FAMILY), FAMILY)


def test_the_frozen_seed_file_gets_defaults_and_ends_from_the_builtin_draws():
    spec = load_spec(PROJECT_ROOT / "specs" / "grpo-token-is.v1.json")
    assert parameter_ends(spec) == {"epsilon_low": (0.1, 0.3), "epsilon_high": (0.1, 0.35), "temperature": (0.45, 2.2)}
    assert [c.label for c in declared_calls(spec, random.Random(0))] == [
        "defaults", "all-min", "all-max", "mixed-ends-1", "mixed-ends-2", "mixed-ends-3", "avoided-below",
        "avoided-above"]


@pytest.mark.parametrize("member", ["token-offpolicy-mask", "token-is"])
def test_the_band_the_draws_keep_around_1_is_called_on_both_sides(member):
    """avoided-below / avoided-above: a temperature inside the band the drawn calls never reach (0.175 from 1 with
    DEFAULT_AWAY), never 1 itself, one side inside the spec's own 0.05, at least INSIDE_FROM of it from 1 (closer, a
    skipped 1/T is within a bfloat16 tolerance), drawn per run; the other parameters at their defaults."""
    from grpo_conform.ops.grpo_logits.declared_cases import INSIDE_FROM

    spec = _member(member)
    seen = set()
    for seed in range(40):
        calls = {c.label: c.values for c in declared_calls(spec, random.Random(seed))}
        below, above = calls["avoided-below"]["temperature"], calls["avoided-above"]["temperature"]
        assert 1 - 0.175 <= below <= 1 - INSIDE_FROM * 0.05 and 1 + INSIDE_FROM * 0.05 <= above <= 1 + 0.175
        assert min(1 - below, above - 1) < 0.05  # the spec's own band, on a drawn side
        assert calls["avoided-below"]["epsilon_low"] == calls["defaults"]["epsilon_low"]
        seen.add((below, above))
    assert len(seen) == 40
    assert "temperature=avoided-below" in declared_names(spec)["boundaries"]


@pytest.mark.parametrize("member", ["token-is", "token-offpolicy-mask-kl", "dapo-global-mask", "dapo-global-accum-mask",
                                    "vespo-mask"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_pair_of_parameters_meets_at_all_four_combinations_of_its_ends(member, seed):
    spec = _member(member)
    ends = parameter_ends(spec)
    rng = random.Random(seed)
    state = rng.getstate()
    rows = [c.values for c in declared_calls(spec, rng) if c.label.startswith(("all-", "mixed-ends-"))]
    names = list(ends)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            met = {(r[a] == ends[a][1], r[b] == ends[b][1]) for r in rows}
            assert met == {(False, False), (False, True), (True, False), (True, True)}, (a, b)
    assert all(r[n] in ends[n] for r in rows for n in names)  # only ends
    # 3 parameters take 3 mixed rows, 4-6 take 4, 7-10 take 5
    assert len(rows) - 2 == {3: 3, 4: 4, 5: 4, 7: 5}[len(names)]
    if not any(c.equal for c in spec.cases):  # only the equalities draw from the rng itself
        assert rng.getstate() == state


def test_one_process_meets_an_accumulation_factor_in_a_declared_call():
    """The case the mixed ends were built for: TRL's factor gradient_accumulation_steps / steps_per_generation
    with num_processes = 1 (all-min sets the factor to 1; the draws keep P away from 1)."""
    spec = _member("dapo-global-accum-mask")
    for seed in range(5):
        rows = [c.values for c in declared_calls(spec, random.Random(seed))]
        assert any(r["num_processes"] == 1 and r["gradient_accumulation_steps"] != r["steps_per_generation"]
                   for r in rows)


@pytest.mark.parametrize("member, parameter, bound", [
    ("token-offpolicy-mask-delta", "delta", "value"), ("cispo-mask", "epsilon_high", "value"),
    ("token-offpolicy-mask", "epsilon_high", "1+value"),
])
def test_a_declared_tie_puts_the_float64_ratio_exactly_on_the_bound(member, parameter, bound):
    spec = _member(member)
    B, S, V = 3, 5, 17
    gen = torch.Generator().manual_seed(3)
    x = {"logits": torch.randn(B, S + 1, V, generator=gen), "completion_ids": torch.randint(0, V, (B, S), generator=gen),
         "advantages": torch.tensor([1.0, -0.5, 0.25]), "old_logprobs": torch.zeros(B, S),
         "completion_mask": torch.ones(B, S, dtype=torch.bool)}
    values = dict(spec.parameter_values)
    x, _ = exact_tie_inputs(spec, x, values, 7)
    r = tie_ratio(spec, x, values)
    values[parameter] = tie_value(bound, r)
    bound_at = {"value": values[parameter], "1+value": 1.0 + values[parameter]}[bound]
    assert bound_at == r and float(torch.tensor(bound_at, dtype=torch.float32)) == 1.0  # fp32: ratio 1 on it
    grad = torch.cat([c.values for c in reference_gradient(x, GrpoParameters.from_spec(spec, values))])
    assert grad.abs().max() > 1e-3  # the unclipped branch is active at the tie: a full gradient


def test_exercised_merges_draws_dtypes_and_shapes():
    draws = {"exercised": {"ties": ["tie at delta"]}, "mask_layouts": ["left"], "call_patterns": ["inference_mode"]}
    out = workload_exercised(draws, {"logits": "bfloat16", "completion_mask": "int64"},
                             {"batch": 1, "seq": 72, "vocab": 256, "seq_next": 73})
    assert out == {"call_patterns": ["inference_mode"], "dtypes": ["completion_mask:int64", "logits:bfloat16"],
                   "mask_layouts": ["left"], "shapes": ["batch=1,seq=72,vocab=256"], "ties": ["tie at delta"]}
    assert merge_exercised(out, {"ties": ["tie at the cap"]})["ties"] == ["tie at delta", "tie at the cap"]


def test_verify_requires_exercised_cases(tmp_path):
    project = make_project(tmp_path / "proj")
    key = new_key()
    trust = make_trust_root(tmp_path / "trust", (key, {}))
    statement = statement_for(project)
    cov = statement["predicate"]["coverage"]
    assert cov["exercised"]["shapes"] == ["batch=2,seq=3,vocab=11"]
    assert "temperature=default" in cov["declared"]["defaults"]
    path = signed_record(project / "evidence" / "a.intoto.json", statement, key)

    def message(policy):
        report = verify(path, trust, policy=policy)
        step = report.files[0].step("policy")
        return report.files[0].ok, " | ".join((step.status, step.message, *step.notes))

    assert message(Policy(require_exercised=("dtypes:*",)))[0]
    ok, text = message(Policy(require_exercised=("ties:tie at delta",)))
    assert not ok and "not exercised: ties:tie at delta" in text
    ok, text = message(Policy(require_declared_cases=True))
    assert not ok and "not exercised: boundaries:epsilon_high=max" in text
    cov["exercised"] = merge_exercised(cov["exercised"], cov["declared"])
    path2 = signed_record(project / "evidence" / "b.intoto.json", statement, key)
    assert verify(path2, trust, policy=Policy(require_declared_cases=True)).files[0].ok
    with pytest.raises(ValueError):
        Policy(require_exercised=("no-colon",))


def test_the_text_report_lists_what_each_member_exercised():
    from types import SimpleNamespace

    from grpo_conform.render import coverage_lines

    w = SimpleNamespace(draws={"exercised": {"ties": ["tie at delta"], "defaults": ["delta=default"]}},
                        dtypes={"logits": "bfloat16"}, axes={"batch": 1, "seq": 72, "vocab": 256})
    impl = SimpleNamespace(members=(SimpleNamespace(spec=SimpleNamespace(member="d", id="grpo/d"), workloads=(w,)),))
    assert coverage_lines(impl) == ["  exercised d: defaults 1; dtypes 1; shapes 1; ties [tie at delta]"]
