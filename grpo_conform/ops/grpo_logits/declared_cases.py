"""Declared cases: the parameter values every conformance workload calls, derived from the spec's
declarations alone (issue 27 item 1), beside the random draws of `grpo_conform.spec.draws`.

From each numeric parameter with a domain or a draw range:
  - `defaults`: one call with every parameter at its declared default exactly (temperature 1.0,
    TRL's 0.2 / 0.2 epsilons): the random draws stay away from the defaults on purpose, so this is
    the only call that sees them;
  - `boundaries`: one call with every parameter at the low end of its range and one at the high
    end. An end is the domain's own where it is finite and inclusive (epsilon 0, beta 0, a count
    of 1), else the end of the draw range (the trainers' typical range the member declares); then
    `mixed_ends`: a few calls with each parameter at one of its ends so that every pair of
    parameters meets at all four combinations of their ends (one low and the other high too:
    one process with an accumulation factor of 8, a zero epsilon_low with the widest epsilon_high); and one
    `near-zero` call where a domain starts at an inclusive 0 the draws stay away from (beta 0.001), and last
    one `below-draws` call: every parameter whose domain reaches below its draws in that gap (`below_draws`),
    and one `above-draws-NAME` call per parameter whose domain reaches above its draws (`above_draws`), then
    `avoided-below` and `avoided-above`: inside the band the draws keep around an avoided value (temperature
    near 1, not 1: `inside_avoided`);
and from the spec's `cases` list (a member's own list replaces the family's common one):
  - `values`: the named parameters at the given values (GSPO's 3e-4 / 4e-4), the rest at defaults;
  - `equalities`: the named parameters at one common value, drawn inside every one's draw range
    (away from the defaults, which the `defaults` call covers);
  - `ties`: every ratio exactly on the clip bound of one parameter. The bound is a function of the
    value (`value`, `1+value`, `1-value`) and `tie_value` inverts it at the ratio the tie inputs
    produce, so that bound == ratio in float64 and in a float32 kernel's arithmetic.
Nothing here knows the loss's input names: the probe that makes the calls builds the tie inputs.
The names returned (`exercised`) are what the evidence record lists under coverage.exercised.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from grpo_conform.errors import GrpoConformError
from grpo_conform.spec import Avoid, CaseTie, Draw, Parameter, Spec
from grpo_conform.spec.draws import DEFAULT_AWAY, draw_for, draw_value


class DeclaredCaseError(GrpoConformError):
    """A declared case the spec's parameters cannot satisfy (an equality with no common range)."""


@dataclass(frozen=True)
class DeclaredCall:
    label: str  # the call's label in the report
    values: dict[str, Any]  # every declared parameter (a tie's bound is set by the probe, see tie_value)
    tie: CaseTie | None
    exercised: tuple[tuple[str, str], ...]  # (category, case name)
    audible: bool = False  # the call's per-sequence scalars made audible (a far value: one term's regime changes)


def _numeric(spec: Spec) -> list[tuple[Parameter, Draw | None]]:
    out = []
    for p in spec.parameters:
        if p.type in ("float", "int") and not isinstance(p.value, bool):
            draw = draw_for(spec, p.name)
            if draw is not None or (p.domain is not None and p.domain.choices is None):
                out.append((p, draw))
    return out


def parameter_ends(spec: Spec) -> dict[str, tuple[Any, Any]]:
    """(low, high) of every numeric parameter: the domain's end where finite and inclusive, else the
    draw range's; a parameter with neither on a side keeps its default there."""
    ends: dict[str, tuple[Any, Any]] = {}
    for p, draw in _numeric(spec):
        d = p.domain
        low = d.min if d is not None and d.min is not None and not d.min_exclusive else (draw.min if draw else p.value)
        high = d.max if d is not None and d.max is not None and not d.max_exclusive else (draw.max if draw else p.value)
        cast = int if p.type == "int" else float
        ends[p.name] = (cast(low), cast(high))
    return ends


def near_zero(spec: Spec) -> dict[str, float]:
    """Each float parameter whose domain starts at an inclusive 0 while its draws start above: a tenth of the
    draw range's low end. At 0 a term vanishes exactly, and the draws never come near it; a kernel that skips
    a term below a threshold (KL at beta <= 1e-3, verl's default coefficient) passed both (adversarial round,
    2026-12-05)."""
    out = {}
    for p, draw in _numeric(spec):
        d = p.domain
        if (p.type == "float" and draw is not None and d is not None and d.min == 0 and not d.min_exclusive
                and draw.min > 0):
            out[p.name] = float(f"{draw.min / 10:.6g}")
    return out


def below_draws(spec: Spec, rng: random.Random) -> dict[str, Any]:
    """Each numeric parameter whose domain reaches below its draw range, at a value drawn between the two that
    near-zero does not give: where the domain's low end is exclusive (temperature, a cap, SAPO's temperatures:
    end + 1/8 to 1/2 of the gap; a cap in 0.19-0.75 where the draws start at 1.5), a positive inclusive end
    (log-uniform between it and the draws' start), and integers (an odd count from end + 2 where the draws start
    past it, which 2 does not divide; end + 1 where they start at it, so a second process or step). Drawn, not
    fixed, so that no kernel can recognise the call by its values. An open end left the declared ends at the draw
    range: a cap at most 1 treated as no cap, and a global normaliser floor-divided (3 // 2), passed every
    default run (twenty-seventh session)."""
    out: dict[str, Any] = {}
    for p, draw in _numeric(spec):
        d = p.domain
        if draw is None or d is None or d.min is None:
            continue
        low, start = d.min, draw.min
        if p.type == "int":
            first = int(low) + 2
            value = (rng.choice(range(first, min(int(start) - 1, first + 14) + 1, 2)) if start > low + 2 else
                     int(low) + 1 if start == low else None)
            if value is not None and (d.max is None or value <= d.max):
                out[p.name] = value
        elif d.min_exclusive and start > low:
            out[p.name] = float(f"{low + (start - low) * rng.uniform(0.125, 0.5):.6g}")
        elif low > 0 and start > low:
            out[p.name] = float(f"{math.exp(rng.uniform(math.log(low), math.log(start))):.6g}")
    return out


ABOVE = (2**18, 2**21)  # where an integer without an upper bound is called past its draws
#: where a float without an upper bound is called past its draws: this many times the draw range's top, log-uniform
ABOVE_FLOAT = (3.0, 8.0)
GAP = 0.125  # a float's value in a gap (below or above the draws) stays this share of the gap off its ends


def above_draws(spec: Spec, rng: random.Random) -> dict[str, Any]:
    """Each numeric parameter whose domain reaches above its draw range, at a value drawn there. Integers without an
    upper bound: odd in ABOVE, at least 4 times float16's largest finite value (65504) and 16-bit counts, so that
    a count divided by the others' defaults (4 processes) is still past them; with one, in the gap above the
    draws. A normaliser held in float16 (inf above 65504) passed every default run with the draws' N <= 48
    (twenty-eighth session). Floats without an upper bound: ABOVE_FLOAT times the draws' top (epsilon_high
    1.05-2.8, temperature 6.6-18, beta 0.6-1.6); with one, inside the gap above the draws (epsilon_low 0.39-0.91).
    Floats were left out until the forty-second session, as changing the loss's regime rather than crossing a
    number format's end; but the regime is the point: CISPO's own default epsilon_high is 5, and a hard clip
    that read an epsilon_high above 1 as CISPO's raw bound (upper = epsilon_high, not 1 + epsilon_high) passed
    every default run (gallery `epsilon-high-above-one-raw-bound`). One call each, the others at their defaults:
    together, one far value could drown another's term (a large beta, the policy term)."""
    out: dict[str, Any] = {}
    for p, draw in _numeric(spec):
        d = p.domain
        if draw is None or d is None:
            continue
        if p.type == "int":
            if d.max is None:
                out[p.name] = rng.randrange(ABOVE[0] + 1, ABOVE[1], 2)
            elif d.max > draw.max:
                out[p.name] = rng.randint(int(draw.max) + 1, int(d.max))
        elif d.max is None:
            lo, hi = (math.log(draw.max * f) for f in ABOVE_FLOAT)
            out[p.name] = float(f"{math.exp(rng.uniform(lo, hi)):.6g}")
        elif d.max > draw.max:
            gap = d.max - draw.max
            out[p.name] = float(f"{rng.uniform(draw.max + GAP * gap, d.max - GAP * gap):.6g}")
    return out


#: where `inside_avoided` starts, as a fraction of the band's half-width: closer to the avoided value a skipped
#: factor (1/T at T = 1.001) moves the gradient less than a bfloat16 workload's tolerance, so no check could see it
INSIDE_FROM = 0.2


def avoided_band(p: Parameter, draw: Draw, avoid: Avoid) -> tuple[float, float]:
    """(the spec's own half-width, the half-width the draws really keep) of the band around an avoided value: where
    the value is the default, `draw_parameters` also keeps DEFAULT_AWAY of the range from it (temperature:
    0.05 declared, 0.175 drawn)."""
    width = avoid.width
    if p.value is not None and float(p.value) == avoid.value and draw.min <= avoid.value <= draw.max:
        return width, max(width, DEFAULT_AWAY * (draw.max - draw.min))
    return width, width


def inside_avoided(spec: Spec, rng: random.Random) -> tuple[dict[str, float], dict[str, float]]:
    """(below, above): each float parameter whose draws avoid a value its domain holds (temperature 1.0: the draws
    stay away so that a dropped 1/T always shows) at a value inside that band, one call on each side. The band held
    every value but the avoided one itself (the `defaults` call's 1.0): a fast path taken when T rounds to 1.0 at
    one decimal passed every default run (adversarial round, `temperature-rounded-to-one`). Which side draws from
    the spec's own band (0.05 from 1) and which from the whole band the draws keep (0.175) is drawn; each distance
    log-uniform from INSIDE_FROM of its band. The values come from the run's secret seed, so a kernel cannot
    recognise them: to pass it computes the factor in the whole band, as anywhere else."""
    below: dict[str, float] = {}
    above: dict[str, float] = {}
    for p, draw in _numeric(spec):
        if p.type != "float" or draw is None:
            continue
        for avoid in draw.avoid:
            if p.domain is not None and not p.domain.contains(avoid.value):
                continue
            own, kept = avoided_band(p, draw, avoid)
            inner_below = rng.random() < 0.5
            for side, out, inner in ((-1, below, inner_below), (1, above, not inner_below)):
                width = own if inner else kept
                distance = math.exp(rng.uniform(math.log(INSIDE_FROM * own), math.log(width)))
                value = float(f"{avoid.value + side * distance:.6g}")
                if value != avoid.value and (p.domain is None or p.domain.contains(value)):
                    out[p.name] = value
    return below, above


def mixed_ends(ends: dict[str, tuple[Any, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Rows of ends that, with all-min and all-max, put every pair of parameters at all four combinations of
    their ends (a covering array of strength 2). Each parameter takes a distinct m-bit pattern of
    weight m // 2 (high in the rows where its bit is set); two distinct patterns of one weight are
    never contained in each other, so each pair has a row with the first high and the second low and one
    the other way round. m is the smallest with C(m, m // 2) >= the count: 3 rows for 3 parameters, 4 for
    4-6, 5 for 7-10. `rng`'s state draws which parameter takes which pattern, so triples vary between workloads
    while every pair is met in each. Parameters whose two ends are equal take no part."""
    live = [n for n, (low, high) in ends.items() if low != high]
    if len(live) < 2:
        return []
    m = 2
    while math.comb(m, m // 2) < len(live):
        m += 1
    patterns = list(itertools.combinations(range(m), m // 2))
    fork = random.Random()
    fork.setstate(rng.getstate())  # leaves `rng` where it was: the probes after this keep their draws
    fork.shuffle(patterns)
    rows = []
    for r in range(m):
        rows.append({n: ends[n][1 if r in pattern else 0] for n, pattern in zip(live, patterns)})
    return rows


def _common_value(spec: Spec, names: tuple[str, ...], rng: random.Random) -> float:
    """A value inside every named parameter's draw range, away from each default."""
    draws = [draw_for(spec, n) for n in names]
    if any(d is None for d in draws):
        raise DeclaredCaseError(f"equality {names}: every parameter needs a draw range")
    lo, hi = max(d.min for d in draws), min(d.max for d in draws)
    if hi < lo:
        raise DeclaredCaseError(f"equality {names}: the draw ranges have no common value")
    params = {p.name: p for p in spec.parameters}
    avoid = tuple(Avoid(value=float(params[n].value), width=DEFAULT_AWAY * (hi - lo)) for n in names)
    return draw_value(Draw(min=lo, max=hi, avoid=avoid), "float", rng, " == ".join(names))


def declared_calls(spec: Spec, rng: random.Random) -> tuple[DeclaredCall, ...]:
    """The calls of the declared cases, in order; random only where an equality draws its value."""
    defaults = dict(spec.parameter_values)
    ends = parameter_ends(spec)
    calls = [DeclaredCall("defaults", defaults, None, tuple(("defaults", f"{n}=default") for n in ends))]
    for side, i in (("min", 0), ("max", 1)):
        values = {**defaults, **{n: e[i] for n, e in ends.items()}}
        calls.append(DeclaredCall(f"all-{side}", values, None, tuple(("boundaries", f"{n}={side}") for n in ends)))
    near = near_zero(spec)
    if near:
        values = {**defaults, **near}
        calls.append(DeclaredCall("near-zero", values, None, tuple(("boundaries", f"{n}=near-zero") for n in near)))
    for case in spec.cases:
        if case.values is not None:
            calls.append(DeclaredCall(case.name, {**defaults, **case.values}, None, (("values", case.name),)))
        elif case.equal is not None:
            v = _common_value(spec, case.equal, rng)
            calls.append(DeclaredCall(case.name, {**defaults, **{n: v for n in case.equal}}, None,
                                      (("equalities", case.name),)))
        elif case.tie is not None:
            calls.append(DeclaredCall(case.name, defaults, case.tie, (("ties", case.name),)))
    # last, so that the calls above keep their seeds (probes.declared_cases seeds a call by its index)
    for k, row in enumerate(mixed_ends(ends, rng), 1):
        calls.append(DeclaredCall(f"mixed-ends-{k}", {**defaults, **row}, None, (("boundaries", f"mixed-ends-{k}"),)))
    fork = random.Random()
    fork.setstate(rng.getstate())  # leaves `rng` where it was, as mixed_ends does
    below = below_draws(spec, fork)  # after the others: their seeds stay
    if below:
        calls.append(DeclaredCall("below-draws", {**defaults, **below}, None,
                                  tuple(("boundaries", f"{n}=below-draws") for n in below)))
    for name, value in above_draws(spec, fork).items():
        calls.append(DeclaredCall(f"above-draws-{name}", {**defaults, name: value}, None,
                                  (("boundaries", f"{name}=above-draws"),), audible=True))
    for side, inside in zip(("below", "above"), inside_avoided(spec, fork)):
        if inside:
            calls.append(DeclaredCall(f"avoided-{side}", {**defaults, **inside}, None,
                                      tuple(("boundaries", f"{n}=avoided-{side}") for n in inside)))
    return tuple(calls)


def tie_value(bound: str, ratio: float) -> float:
    """The parameter value whose clip bound is exactly `ratio` (float64, exact by Sterbenz near 1).
    `1-value` needs a ratio <= 1; above 1 it gives 0, a bound of exactly 1, which a float32 kernel's
    ratio of exactly 1 ties (the float64 reference sees it inside the bound: the same branch)."""
    if bound == "value":
        return ratio
    if bound == "1+value":
        return max(0.0, ratio - 1.0)
    if bound == "1-value":
        return max(0.0, 1.0 - ratio)
    raise DeclaredCaseError(f"unknown bound form {bound!r}")


def merge_exercised(*parts: dict[str, list[str]] | None) -> dict[str, list[str]]:
    """{category: sorted unique case names} over several workloads' records."""
    out: dict[str, set[str]] = {}
    for part in parts:
        for category, names in (part or {}).items():
            out.setdefault(str(category), set()).update(str(n) for n in names)
    return {k: sorted(v) for k, v in sorted(out.items())}


def record(draws: dict[str, Any], category: str, name: str) -> None:
    """Add one exercised case to a workload's draws (draws["exercised"], {category: [names]})."""
    names = draws.setdefault("exercised", {}).setdefault(category, [])
    if name not in names:
        names.append(name)


def declared_names(spec: Spec) -> dict[str, list[str]]:
    """{category: case names} the spec declares (what `verify --require-declared-cases` asks for)."""
    return merge_exercised(*({c: [n]} for call in declared_calls(spec, random.Random(0)) for c, n in call.exercised))


def workload_exercised(draws: dict[str, Any], dtypes: dict[str, str], axes: dict[str, int]) -> dict[str, list[str]]:
    """What one workload exercised: the cases its probes recorded (draws["exercised"]), the mask layouts
    and call patterns other probes name in draws, the input dtypes and the shape."""
    out = merge_exercised(draws.get("exercised"))
    for key in ("mask_layouts", "call_patterns"):
        if draws.get(key):
            out = merge_exercised(out, {key: [str(x) for x in draws[key]]})
    if dtypes:
        out = merge_exercised(out, {"dtypes": [f"{k}:{v}" for k, v in dtypes.items()]})
    if axes:
        shape = ",".join(f"{k}={v}" for k, v in axes.items() if k != "seq_next")
        out = merge_exercised(out, {"shapes": [shape]})
    return out
