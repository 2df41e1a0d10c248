"""Parameter draws for conformance calls (decision draws, docs/decisions.md): from each parameter's declared `draw`
(uniform in [min, max], from the parent's seed, rejecting values near an `avoid` value), and for
specs that declare no draws (the frozen seed file) from the documented built-in table below.

Temperature is drawn away from 1 on every call (a missing 1/T factor shows); epsilons stay inside
their domains; parameters without a draw (loss_type, importance_sampling_level: fixed per member)
keep their declared value. Timed runs never use draws: they use `Spec.parameter_values`.

Every drawn float also stays DEFAULT_AWAY of its draw range away from the parameter's declared
default, whatever the spec's own `avoid` list says: an implementation that ignores the value it is
passed and hard-codes the default (a beta of 0.04, an epsilon of 0.2) must not match by luck (the
gallery's kl-beta-ignored passed its loss check when beta was drawn at 0.045).

Two drawn floats whose draw ranges overlap also stay APART of the range apart (epsilon_low and epsilon_high,
the SAPO and VESPO pairs): independent uniform draws are never exactly equal, but 2% of them were within 0.004
of each other, where a kernel that uses one for the other (the wrong epsilon on a fast path, gallery
`one-sign-fast-path`) moves the loss less than its allowance: it passed 8 of 400 runs and one CI run. So the
drawn calls test distinct values and the declared case (`epsilon_low == epsilon_high`) tests equal ones;
nothing falls in between. Integers keep plain draws: equal values come with a real probability, and
both equal and unequal are then each reached. Separation yields where a range is too crowded to keep it.
"""

from __future__ import annotations

import random
from typing import Any

from grpo_conform.errors import GrpoConformError
from grpo_conform.spec.model import Avoid, Draw, Spec

# The frozen grpo-token-is 1.0.0 file declares no draws; these are its draws (docs/spec-family.md),
# the same ranges the family member token-is declares.
BUILTIN_DRAWS: dict[str, Draw] = {
    "epsilon_low": Draw(min=0.1, max=0.3),
    "epsilon_high": Draw(min=0.1, max=0.35),
    "temperature": Draw(min=0.45, max=2.2, avoid=(Avoid(value=1.0, width=0.05),)),
}
_TRIES = 10_000
DEFAULT_AWAY = 0.1  # of the draw range: how far a drawn float stays from the declared default
APART = 0.08  # of the draw range: how far a drawn float stays from an earlier drawn float inside its range
_DIGITS = 6  # drawn floats are rounded, so records show them exactly


class DrawError(GrpoConformError):
    """A draw range that cannot produce a value (everything in it is avoided)."""


def draw_for(spec: Spec, name: str) -> Draw | None:
    p = next(p for p in spec.parameters if p.name == name)
    if p.draw is not None:
        return p.draw
    if not any(q.draw is not None for q in spec.parameters):
        return BUILTIN_DRAWS.get(name)
    return None


def draw_value(draw: Draw, kind: str, rng: random.Random, name: str = "parameter") -> Any:
    for _ in range(_TRIES):
        if kind == "int":
            v: Any = rng.randint(int(draw.min), int(draw.max))
        else:
            v = round(rng.uniform(draw.min, draw.max), _DIGITS)
        if all(abs(v - a.value) >= a.width for a in draw.avoid):
            return v
    raise DrawError(f"{name}: no value in [{draw.min}, {draw.max}] stays clear of {[a.value for a in draw.avoid]}")


def draw_parameters(spec: Spec, rng: random.Random) -> dict[str, Any]:
    """Every declared parameter: drawn where the spec (or the built-in table) says so, else the default."""
    out: dict[str, Any] = {}
    drawn_floats: list[float] = []
    for p in spec.parameters:
        draw = draw_for(spec, p.name)
        if draw is None:
            out[p.name] = p.value
            continue
        if p.type == "float" and isinstance(p.value, (int, float)) and draw.min <= p.value <= draw.max:
            away = Avoid(value=float(p.value), width=DEFAULT_AWAY * (draw.max - draw.min))
            draw = Draw(min=draw.min, max=draw.max, avoid=tuple(draw.avoid) + (away,))
        v = _draw_apart(draw, p.type, rng, p.name, drawn_floats)
        if p.type == "float":
            drawn_floats.append(v)
        if p.domain is not None and not p.domain.contains(v):  # the spec check forbids this; keep it loud
            raise DrawError(f"{p.name}: drawn {v!r} is outside the domain")
        out[p.name] = v
    return out


def _draw_apart(draw: Draw, kind: str, rng: random.Random, name: str,
                drawn_floats: list[float]) -> Any:
    """A float kept APART from the earlier drawn floats that lie in its range (module docstring); the plain
    draw where those exclusions leave no room (a crowded range) and for integers."""
    if kind == "float":
        width = APART * (draw.max - draw.min)
        near = tuple(Avoid(value=u, width=width) for u in drawn_floats if draw.min - width < u < draw.max + width)
        if near:
            try:
                return draw_value(Draw(min=draw.min, max=draw.max, avoid=tuple(draw.avoid) + near), kind, rng, name)
            except DrawError:
                pass
    return draw_value(draw, kind, rng, name)
