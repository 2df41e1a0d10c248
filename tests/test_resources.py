"""The worker's holdings (isolation/resources.py, the no-resource-growth check): what a sample counts and
what growth the judge allows. The check end to end: tests/gallery/keeps-graph-per-call and
opens-file-per-call must fail it, the bundled implementations pass it (test_bundled)."""

from __future__ import annotations

import os

import pytest
import torch

from grpo_conform.isolation.resources import ALLOWED, growth, sample


def test_a_sample_counts_tensors_kept_alive_and_files_left_open():
    before = sample(torch)
    kept = [torch.zeros(3) for _ in range(10)]
    files = [open(os.devnull) for _ in range(5)]
    try:
        after = sample(torch)
    finally:
        for f in files:
            f.close()
    assert after["tensors"] - before["tensors"] >= 10
    if before["file_descriptors"] is not None:  # Linux
        assert after["file_descriptors"] - before["file_descriptors"] == 5
    assert sample(torch)["cuda_bytes"] is None or torch.cuda.is_available()
    del kept


def test_garbage_is_not_growth():
    before = sample(torch)
    for _ in range(20):
        a = [torch.zeros(2)]
        a.append(a)  # a reference cycle holding a tensor: freed only by a collection
    del a
    assert sample(torch)["tensors"] - before["tensors"] <= 1


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_growth_beyond_the_allowance_is_named_and_up_to_it_is_not(name):
    first = {k: 100 for k in ALLOWED}
    assert growth(first, {**first, name: 100 + ALLOWED[name]}) == {}
    grew = growth(first, {**first, name: 101 + ALLOWED[name]})
    assert grew == {name: {"first": 100, "last": 101 + ALLOWED[name], "allowed": ALLOWED[name]}}


def test_what_could_not_be_measured_is_not_judged():
    first = {k: None for k in ALLOWED}
    assert growth(first, {k: 10**9 for k in ALLOWED}) == {}


def test_objects_frozen_after_the_first_sample_are_growth():
    """gc.freeze() takes what it moves out of gc.get_objects(), so a leak frozen per call keeps the tensor count
    flat (tests/gallery/hides-leak-with-gc-freeze); the frozen count itself grows."""
    import gc

    before = sample(torch)
    kept = [torch.zeros(2) for _ in range(10)]
    gc.freeze()
    try:
        after = sample(torch)
    finally:
        gc.unfreeze()
    assert after["tensors"] - before["tensors"] <= ALLOWED["tensors"]  # hidden from the tensor count
    assert set(growth(before, after)) == {"frozen_objects"}
    del kept
