"""Cases for the peers lane: the member's parameters drawn as the validator draws them (temperature
fixed away from 1 so the designed ratios hold), inputs from tests/member_cases.py (ratios in both clip
regions and the unclipped one, padded, fully masked and full rows), and the named draws of
NotExpressible rows: parameters inside the member's domain where the nearest setting must differ."""

from __future__ import annotations

import random
from typing import Any

from grpo_conform.spec import draw_parameters
from member_cases import TEMPERATURE, make_inputs


def _delta_below_upper_clip(values: dict[str, Any], rng: random.Random) -> None:
    eps_high = rng.uniform(0.2, 0.35)
    values.update(epsilon_high=eps_high, delta=rng.uniform(1.02, 1 + eps_high - 0.04))


def _items_below_processes(values: dict[str, Any], rng: random.Random) -> None:
    values.update(num_processes=rng.randint(2, 8))
    values.update(num_items_in_batch=rng.randint(1, values["num_processes"] - 1))


WHERE = {"delta below 1 + epsilon_high": _delta_below_upper_clip,
         "num_items_in_batch below num_processes": _items_below_processes}


def cases(spec, seeds=(0, 1, 2), where: str = ""):
    for seed in seeds:
        rng = random.Random(seed)
        values = dict(draw_parameters(spec, rng))
        values["temperature"] = TEMPERATURE
        if where:
            WHERE[where](values, rng)
        yield seed, make_inputs(spec, seed, values), values
