"""Floors: headroom-v1 reproduces the seed page, shapes come from the spec, measured and arithmetic floors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from grpo_conform.errors import EXIT_USAGE
from grpo_conform.floors import (FloorError, FloorRequest, below_floor, compute_floor, compute_floors, format_ns,
                                 ratio, resolve_for_floor, run_floor, tensor_traffic)
from grpo_conform.hardware import Ceilings, UnknownGpu, load_catalogue
from grpo_conform.spec import load_spec

SPEC_FILE = Path(__file__).resolve().parent.parent / "specs" / "grpo-token-is.v1.json"
A100_BPS = 2039e9


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC_FILE)


@pytest.fixture(scope="module")
def a100():
    return load_catalogue().get("a100-sxm4-80gb")


def _floor(spec, workload, protocol, gpu=None, ceilings=None, model="headroom-v1"):
    # the tests of this half are the seed page's model; traffic-v1 is tested in test_floors_traffic.py
    return compute_floor(spec, resolve_for_floor(spec, spec.workload(workload)), protocol, gpu, ceilings, model=model)


def _seed_forward_bytes(batch: int, vocab: int = 128256, seq: int = 1024, logit_bytes: int = 2) -> int:
    return batch * (seq + 1) * vocab * logit_bytes + batch * seq * 8 + batch * 4 + 4


def test_seed_floor_257_9_us_reproduced(spec, a100):
    floor = _floor(spec, "seed-b2", "forward", a100)
    assert floor.bytes_read == 2 * 1025 * 128256 * 2 + 2 * 1024 * 8 + 2 * 4
    assert floor.bytes_written == 4
    assert floor.dram_ns == math.floor(_seed_forward_bytes(2) / A100_BPS * 1e9)
    assert round(floor.dram_ns / 1e3, 1) == 257.9
    assert floor.binding == "dram" and floor.floor_ns == floor.dram_ns
    assert format_ns(floor.floor_ns) == "257.9 us"


def test_run_floor_report_says_257_9_us(spec):
    report = run_floor(FloorRequest(str(SPEC_FILE), "seed-b2", "A100 80GB", "forward", model="headroom-v1"))
    text = "\n".join(report.lines())
    assert "forward: floor 257.9 us (dram binds) [headroom-v1]" in text
    assert "2,039 GB/s" in text and "525,865,996 B" in text
    assert report.match.gpu.id == "a100-sxm4-80gb" and report.notes  # ambiguous name, noted
    out = json.loads(json.dumps(report.to_json()))
    assert out["floors"][0]["floor_ns"] == 257903 and out["spec"]["id"] == "grpo-token-is"
    assert out["floors"][0]["model"] == "headroom-v1"


def test_the_default_report_prints_both_models_by_name():
    report = run_floor(FloorRequest(str(SPEC_FILE), "seed-b2", "A100 80GB", "forward"))
    assert [f.method for f in report.floors] == ["traffic-v1", "headroom-v1"]
    text = "\n".join(report.lines())
    assert "forward: floor 257.9 us (dram binds) [headroom-v1]" in text
    assert "model traffic-v1:" in text and "read advantages float32 [2]: 8 B" in text


def test_spec_id_and_torch_name_work_too():
    report = run_floor(FloorRequest("grpo-token-is@1.0.0", "seed-b2", "NVIDIA A100-SXM4-80GB", model="headroom-v1"))
    assert report.floors[0].floor_ns == 257903 and not report.notes


def test_batch_16_floor_is_2_06_ms_and_1_97_ms_is_below_it(spec, a100):
    floor = _floor(spec, "seed-b16", "forward", a100)
    assert format_ns(floor.floor_ns) == "2.06 ms"
    logits_only = 16 * 1025 * 128256 * 2 / A100_BPS * 1e9
    assert floor.strict_ns < logits_only < floor.dram_ns
    assert below_floor(1.97e6, floor)
    assert not below_floor(2.07e6, floor)
    assert not below_floor(1.89e6, _floor(spec, "seed-b8", "forward", a100))


def test_full_adds_the_gradient_once(spec, a100):
    fwd = _floor(spec, "seed-b2", "forward", a100)
    full = _floor(spec, "seed-b2", "full", a100)
    gradient = 2 * 1025 * 128256 * 2
    assert full.bytes_read == fwd.bytes_read
    assert full.bytes_written == fwd.bytes_written + gradient
    assert full.dram_ns == math.floor((fwd.bytes_total + gradient) / A100_BPS * 1e9)
    assert [t.tensor for t in full.traffic if t.role == "gradient"] == ["dloss/dlogits"]


def test_backward_has_no_floor_of_its_own(spec, a100):
    floor = _floor(spec, "seed-b2", "backward", a100)
    assert not floor.meaningful and floor.floor_ns is None and floor.strict_ns is None
    assert not below_floor(1, floor) and ratio(1e6, floor) == math.inf
    assert "no floor of its own" in floor.derivation[0]
    assert set(compute_floors(spec, resolve_for_floor(spec, spec.workload("seed-b2")), a100)) == {
        "forward", "full", "full-scaled", "backward"}


def test_arithmetic_floor(spec, a100):
    floor = _floor(spec, "seed-b2", "forward", a100)
    exps = 2 * 1024 * 128256
    assert floor.exps == exps
    assert floor.arithmetic_ns == math.floor(exps / (108 * 16 * 1410e6) * 1e9)
    assert round(floor.arithmetic_ns / 1e3, 1) == 107.8
    assert any("special-function unit" in line for line in floor.derivation)


# shared/anchors/h200-peers-2026-11-30.json: ceilings measured on one H200 and the floors derived there
H200_COPY_TBPS, H200_READ_TBPS = 4.28201854877914, 4.229994588638835
H200_B2_FWD_READ_MS, H200_B2_FULL_RW_MS = 0.12431448527436828, 0.24560827750264025


def test_measured_floor_matches_the_h200_anchors(spec):
    ceilings = Ceilings("NVIDIA H200", H200_COPY_TBPS * 1e12, H200_READ_TBPS * 1e12)
    h200 = load_catalogue().get("h200-sxm")
    fwd = _floor(spec, "seed-b2", "forward", h200, ceilings)
    full = _floor(spec, "seed-b2", "full", h200, ceilings)
    assert fwd.measured_ns / 1e6 == pytest.approx(H200_B2_FWD_READ_MS, rel=2e-4)  # read-dominated: read ceiling
    assert full.measured_ns / 1e6 == pytest.approx(H200_B2_FULL_RW_MS, rel=2e-4)  # read + write: copy ceiling
    assert fwd.binding == "measured" and fwd.floor_ns == fwd.measured_ns > fwd.dram_ns
    assert fwd.strict_ns <= fwd.dram_ns  # impossibility is still judged on the datasheet
    assert ratio(fwd.floor_ns * 2, fwd) == pytest.approx(2.0)


def test_unknown_gpu_with_measured_ceilings_only(spec):
    ceilings = Ceilings("NVIDIA Z9000", 2.0e12, 2.0e12)
    floor = _floor(spec, "seed-b2", "forward", None, ceilings)
    assert floor.dram_ns is None and floor.arithmetic_ns is None
    assert floor.binding == "measured" and floor.gpu == "NVIDIA Z9000"
    assert 0.85 * floor.measured_ns < floor.strict_ns < 0.9 * floor.measured_ns
    nothing = _floor(spec, "seed-b2", "forward")
    assert nothing.floor_ns is None and not below_floor(1, nothing) and nothing.bytes_written == 4


def _variant(spec_file: Path, tmp_path: Path, edit) -> object:
    doc = json.loads(spec_file.read_text())
    edit(doc)
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(doc))
    return load_spec(path)


def test_floors_follow_the_spec_not_hard_coded_shapes(tmp_path, spec, a100):
    def other_vocab(doc):
        for w in doc["workloads"]:
            if w["name"] == "seed-b2":
                w["axes"]["vocab"] = 32000
                w["dtypes"]["logits"] = "float32"

    variant = _variant(SPEC_FILE, tmp_path, other_vocab)
    floor = _floor(variant, "seed-b2", "forward", a100)
    expected = _seed_forward_bytes(2, vocab=32000, logit_bytes=4)
    assert floor.bytes_total == expected
    assert floor.dram_ns == math.floor(expected / A100_BPS * 1e9)
    assert floor.dram_ns != _floor(spec, "seed-b2", "forward", a100).dram_ns


def test_an_extra_declared_input_is_counted(tmp_path, a100):
    def add_input(doc):
        doc["inputs"].append({"name": "old_logprobs", "dtypes": ["float32"], "shape": ["batch", "seq"],
                              "differentiable": False})

    variant = _variant(SPEC_FILE, tmp_path, add_input)
    floor = _floor(variant, "seed-b2", "forward", a100)
    assert floor.bytes_total == _seed_forward_bytes(2) + 2 * 1024 * 4
    assert any(t.tensor == "old_logprobs" for t in tensor_traffic(variant, resolve_for_floor(
        variant, variant.workload("seed-b2"))))


def test_drawn_workload_uses_the_smallest_shape(spec, a100):
    resolved = resolve_for_floor(spec, spec.workload("drawn-bf16"))
    assert resolved.axes["batch"] == 1 and resolved.axes["seq"] == 1 and resolved.axes["vocab"] == 700
    report = run_floor(FloorRequest(str(SPEC_FILE), "drawn-bf16", "NVIDIA A100-SXM4-80GB", "all", model="headroom-v1"))
    assert [f.protocol for f in report.floors] == ["forward", "full", "full-scaled", "backward"]
    assert any("smallest shape" in n for n in report.notes)


def test_bad_requests(spec, a100):
    with pytest.raises(FloorError, match="protocol"):
        _floor(spec, "seed-b2", "sideways", a100)
    with pytest.raises(FloorError, match="protocol"):
        run_floor(FloorRequest(str(SPEC_FILE), "seed-b2", "H200", "sideways"))
    with pytest.raises(UnknownGpu) as err:
        run_floor(FloorRequest(str(SPEC_FILE), "seed-b2", "NVIDIA Z9000"))
    assert "Known GPUs" in str(err.value) and err.value.exit_code == EXIT_USAGE


def test_format_ns():
    assert format_ns(512) == "512 ns"
    assert format_ns(257_903) == "257.9 us"
    assert format_ns(2_063_231) == "2.06 ms"
    assert format_ns(None) == "n/a"
