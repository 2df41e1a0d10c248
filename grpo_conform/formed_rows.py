"""A reference gradient chunk of score rows z, given by what forms it rather than by its values:
expected[r, v] = coef[r] * (onehot(target[r])[v] - softmax(z[r] / T)[v]).

The float64 reference (`ops/grpo_logits/reference.py`) forms every chunk with `dense` (its one torch
formula). The fused comparison on CUDA (`compare_fused.py`) forms the same values inside its kernel
from the scores themselves (2 bytes an element in bf16) instead of reading a materialised float64 chunk
(8 bytes, after ~8 float64 passes to make it): docs/checks.md, "Fused comparison". The two are the
same float64 formula computed by two programs; their sums over a row differ in order, so an element
may differ in its last bits (tests/test_compare_fused.py bounds it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FormedRows:
    z: torch.Tensor  # [rows, width] the score rows as given (any float dtype)
    target: torch.Tensor  # [rows] int: each row's target column (any value where coef is 0: masked rows)
    coef: torch.Tensor  # [rows] float64: dL/dlogp / T of the row, times the upstream scalar (0: masked rows)
    temperature: float

    @property
    def shape(self) -> torch.Size:
        return self.z.shape

    def rows(self, index) -> "FormedRows":
        """The same formula on a subset of the rows (a slice or an index tensor)."""
        return FormedRows(self.z[index], self.target[index], self.coef[index], self.temperature)

    def dense(self) -> torch.Tensor:
        """The float64 values, [rows, width]: the reference's own operations, in its order."""
        z = self.z if self.z.dtype == torch.float64 else self.z.to(torch.float64)
        g = torch.softmax(z / self.temperature, dim=-1).neg_()  # (z may be a view of float64 inputs: no div_)
        g.scatter_add_(-1, self.target.clamp_min(0).unsqueeze(-1).to(torch.int64), torch.ones_like(g[:, :1]))
        return g.mul_(self.coef.unsqueeze(-1))
