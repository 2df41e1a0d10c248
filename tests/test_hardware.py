"""GPU catalogue (validation, name matching) and measured ceilings, on the CPU."""

from __future__ import annotations

import copy
import json
import sys
import types

import pytest

from grpo_conform import hardware
from grpo_conform.data import GPUS_FILE, read_text
from grpo_conform.errors import EXIT_ENVIRONMENT, EXIT_USAGE, EnvironmentProblem, GrpoConformError
from grpo_conform.hardware import (CatalogueError, Ceilings, UnknownGpu, describe_gpu, describe_running_gpu,
                                   load_catalogue, measure_ceilings, measure_streams, name_tokens, parse_catalogue,
                                   plan_buffer_bytes, quantile)

REQUIRED = ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "b200", "l4", "l40s", "a10",
            "rtx-4090", "mi300x")


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue()


def _doc() -> dict:
    return json.loads(read_text(GPUS_FILE))


def test_catalogue_has_the_required_gpus_with_sources(catalogue):
    ids = {g.id for g in catalogue.gpus}
    assert set(REQUIRED) <= ids
    for g in catalogue.gpus:
        assert g.source.startswith("https://"), g.id
        assert len(g.exp_basis) > 10 and g.dram_gbps > 0 and g.compute_units > 0
    assert catalogue.get("a100-sxm4-80gb").dram_gbps == 2039


def test_derived_figures(catalogue):
    a100 = catalogue.get("a100-sxm4-80gb")
    assert a100.dram_bytes_per_s == 2039e9
    assert a100.exp_per_s == 108 * 16 * 1410e6
    assert a100.cache_bytes == 40 * 2**20


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d["gpus"][0].pop("source"), "$.gpus[0].source"),
    (lambda d: d["gpus"][1].update(source="http://example.com/a100.pdf"), "$.gpus[1].source"),
    (lambda d: d["gpus"][2].update(dram_gbps=-5), "$.gpus[2].dram_gbps"),
    (lambda d: d["gpus"][3].update(bandwidth=1), "$.gpus[3].bandwidth"),
    (lambda d: d["gpus"][0].update(match=["NVIDIA"]), "$.gpus[0].match"),
    (lambda d: d["gpus"].append(copy.deepcopy(d["gpus"][0])), "$"),
    (lambda d: d.update(format="gpus/2"), "$.format"),
])
def test_bad_entries_fail_with_their_location(mutate, where):
    doc = _doc()
    mutate(doc)
    with pytest.raises(CatalogueError) as err:
        parse_catalogue(doc, "bad.json")
    assert err.value.where.startswith(where)
    assert "bad.json" in str(err.value)
    assert err.value.exit_code == EXIT_USAGE


def test_error_names_the_entry_id():
    doc = _doc()
    doc["gpus"][4]["boost_clock_mhz"] = 0
    with pytest.raises(CatalogueError, match=r"entry 'h100-sxm'"):
        parse_catalogue(doc, "bad.json")


def test_unreadable_and_invalid_json_files(tmp_path):
    with pytest.raises(CatalogueError, match="cannot read"):
        load_catalogue(tmp_path / "missing.json")
    bad = tmp_path / "gpus.json"
    bad.write_text('{"format": ', encoding="utf-8")
    with pytest.raises(CatalogueError, match="line 1"):
        load_catalogue(bad)


def test_name_tokens():
    assert name_tokens("NVIDIA A100-SXM4-80GB") == {"a100", "sxm4", "80gb"}
    assert name_tokens("A100 80 GB") == {"a100", "80gb"}
    assert name_tokens("AMD Instinct MI300X") == {"mi300x"}


@pytest.mark.parametrize("name, gpu_id", [
    ("NVIDIA H200", "h200-sxm"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA A10", "a10"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("AMD Instinct MI300X", "mi300x"), ("NVIDIA B200", "b200"),
    ("H200", "h200-sxm"), ("h100 sxm", "h100-sxm"), ("l40s", "l40s"), ("rtx-4090", "rtx-4090"),
])
def test_exact_names_resolve(catalogue, name, gpu_id):
    match = catalogue.resolve(name)
    assert match.gpu.id == gpu_id
    assert match.note is None and not match.ambiguous


def test_ambiguous_names_take_the_fastest_variant_with_a_note(catalogue):
    match = catalogue.resolve("NVIDIA A100")
    assert match.gpu.id == "a100-sxm4-80gb"
    assert match.ambiguous and set(match.candidates) == {"a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb",
                                                         "a100-pcie-80gb"}
    assert "fastest" in match.note and "lower bound" in match.note
    human = catalogue.resolve("A100 80GB")
    assert human.gpu.id == "a100-sxm4-80gb" and set(human.candidates) == {"a100-sxm4-80gb", "a100-pcie-80gb"}
    assert catalogue.resolve("H100").gpu.id == "h100-sxm"


@pytest.mark.parametrize("name", ["NVIDIA Z9000", "NVIDIA H100 NVL", "NVIDIA A10G",
                                  "NVIDIA GeForce RTX 4090 Laptop GPU", ""])
def test_unknown_names_raise_with_the_known_list(catalogue, name):
    assert catalogue.lookup(name) is None
    with pytest.raises(UnknownGpu) as err:
        catalogue.resolve(name)
    assert "NVIDIA A100 80GB SXM (a100-sxm4-80gb)" in str(err.value)
    assert err.value.exit_code == EXIT_USAGE


def test_describe_an_unknown_running_gpu_uses_measured_figures_only(catalogue):
    ceilings = Ceilings("NVIDIA Z9000", 3.0e12, 2.9e12)
    running = describe_gpu("NVIDIA Z9000", {"multi_processor_count": 7}, ceilings, catalogue)
    assert running.gpu is None and running.match is None
    assert "not in the GPU catalogue" in running.notes[0]
    out = json.loads(json.dumps(running.to_json()))
    assert out["catalogue"] is None and out["ceilings"]["copy_bytes_per_s"] == 3.0e12


def test_describe_a_known_gpu_notes_a_different_sm_count(catalogue):
    running = describe_gpu("NVIDIA H200", {"multi_processor_count": 66}, None, catalogue)
    assert running.gpu.id == "h200-sxm"
    assert any("66 SMs" in n for n in running.notes)
    assert running.to_json()["catalogue"]["dram_gbps"] == 4800


def test_describe_running_gpu_on_cpu_is_an_environment_problem():
    with pytest.raises(EnvironmentProblem):
        describe_running_gpu("cpu")


def test_quantile():
    assert quantile([10, 20, 30, 40], 0.5) == 25
    assert quantile([10, 20, 30], 0.5) == 20
    assert quantile([10, 20, 30], 0.0) == 10 and quantile([10, 20, 30], 1.0) == 30
    assert quantile([7], 0.9) == 7


def test_measure_streams_with_a_fake_timer():
    calls = []

    def fake_timer(fn, reps, warmup):
        calls.append((fn(), reps, warmup))
        base = 1_000_000 if calls[-1][0] == "copy" else 600_000
        return [base + 1000 * i for i in range(reps)]

    size = 2 * 2**30
    ceilings = measure_streams(lambda: "copy", lambda: "read", size, device_name="Fake GPU", timer=fake_timer,
                               timer_name="fake", reps=5, warmup=2)
    assert calls == [("copy", 5, 2), ("read", 5, 2)]
    assert ceilings.copy.median_ns == 1_002_000 and ceilings.read.median_ns == 602_000
    assert ceilings.copy.bytes_per_rep == 2 * size and ceilings.read.bytes_per_rep == size
    assert ceilings.copy_bytes_per_s == pytest.approx(2 * size * 1e9 / 1_002_000)
    assert ceilings.read_bytes_per_s == pytest.approx(size * 1e9 / 602_000)
    out = ceilings.to_json()
    assert out["timer"] == "fake" and out["copy"]["reps"] == 5 and out["copy"]["warmup"] == 2
    assert out["read"]["p10_ns"] <= out["read"]["median_ns"] <= out["read"]["p90_ns"]
    assert all(isinstance(s, int) for s in out["copy"]["samples_ns"])
    assert "read + written" in out["copy"]["method"]


def test_measure_streams_rejects_a_broken_timer():
    with pytest.raises(GrpoConformError, match="samples"):
        measure_streams(lambda: 0, lambda: 0, 1024, device_name="x", timer=lambda f, r, w: [1, 2],
                        timer_name="short", reps=5, warmup=0)
    with pytest.raises(GrpoConformError, match="reps"):
        measure_streams(lambda: 0, lambda: 0, 1024, device_name="x", timer=lambda f, r, w: [1] * r,
                        timer_name="t", reps=1)


def test_measure_ceilings_needs_cuda():
    with pytest.raises(EnvironmentProblem) as err:
        measure_ceilings("cpu")
    assert err.value.exit_code == EXIT_ENVIRONMENT
    assert "CUDA" in str(err.value)


def test_measure_ceilings_without_cuda_available(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EnvironmentProblem, match="is_available"):
        measure_ceilings("cuda")


def test_plan_buffer_bytes():
    assert plan_buffer_bytes(60 * 2**20, 140 * 10**9) == 4 * 2**30  # H200: 4 GiB, many times its L2
    assert plan_buffer_bytes(512 * 2**20, 190 * 10**9) == 8 * 2**30  # 16 x 512 MiB, capped at 8 GiB
    small = plan_buffer_bytes(40 * 2**20, 3 * 10**9)
    assert 4 * 40 * 2**20 <= small <= 0.4 * 3 * 10**9
    with pytest.raises(EnvironmentProblem, match="free"):
        plan_buffer_bytes(60 * 2**20, 300 * 2**20)


