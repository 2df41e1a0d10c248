"""Every row of a special id (pad/bos/eos-like, top of the table: generators/token_ids.py) are never
near one-hot at their token: there the token's gradient s (1 - p_t) is below every allowance, and a
kernel that drops those tokens (gallery treats-special-ids-as-padding) passed every call whose special
ids all sat on such rows (~19% of call A's sets before `_unpeak`; it passed a slow-lane run once)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_conform.ops import operation_for
from grpo_conform.ops.grpo_logits.generators.token_ids import pool_ids
from grpo_conform.spec import find_spec, load_family

ROOT = Path(__file__).resolve().parent.parent


def _worst_special_gap(p_target: torch.Tensor, ids: torch.Tensor, vocab: int) -> float | None:
    special = torch.isin(ids, torch.tensor(pool_ids(vocab)))
    return float((1 - p_target)[special].min()) if special.any() else None


@pytest.mark.parametrize("workload", ["odd-vocab", "small-bf16"])
def test_no_special_id_row_of_the_logits_is_peaked(workload):
    spec = find_spec("grpo-token-is")
    op, rw = operation_for(spec), spec.resolve(spec.workload(workload))
    vocab = rw.axes["vocab"]
    for seed in range(40):
        x = op.generate(spec, rw, seed, "cpu", case=0).tensors
        ids = x["completion_ids"]
        z = x["logits"][:, : ids.shape[1]].double()
        gap = _worst_special_gap(torch.softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1), ids, vocab)
        assert gap is None or gap > 1e-3, (seed, gap)


def test_no_special_id_row_of_the_fused_operation_is_peaked():
    spec = load_family(ROOT / "specs" / "grpo-fused-linear.v1.json").member("token-is")
    op, rw = operation_for(spec), spec.resolve(spec.workload("odd-bf16"))
    for seed in range(12):
        x = op.generate(spec, rw, seed, "cpu", case=0).tensors
        ids, w = x["completion_ids"], x["weight"].double()
        z = x["hidden"].double() @ w.t()
        vocab = w.shape[0]
        gap = _worst_special_gap(torch.softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1), ids, vocab)
        assert gap is None or gap > 1e-3, (seed, gap)
