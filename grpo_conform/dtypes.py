"""Dtype names as the spec writes them, and their torch dtypes (one table for every module)."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,  # completion_mask (spec family members)
}


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
