"""Records a trusted key signed but that lie about the hardware or the physics (adversarial round,
2026-12-05, /work/adv/evidence): each was signed by `sign`, passed `verify` and was ranked #1 by
`report`. Built from committed H200 records of current identities, edited as the round did; each must
now be refused by the semantics step (spec_problems), and the report must not rank what slips past."""

from __future__ import annotations

import base64
import json

import pytest

from grpo_conform.evidence.spec_semantics import spec_problems
from grpo_conform.evidence.statement import PROJECT_ROOT

H200 = PROJECT_ROOT / "evidence" / "h200"


def _statement(pattern: str) -> dict:
    (path,) = H200.glob(pattern)
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))


def _faster(st: dict, median_ns: int) -> dict:
    """Every timing at `median_ns`, the record's own floors zeroed (so only a recomputed floor can object)."""
    for w in st["predicate"]["workloads"]:
        for t in w.get("timings", []):
            t["event"]["median_ns"] = median_ns
            t["floor"]["floor_ns"] = t["floor"]["measured_ns"] = t["floor"]["dram_ns"] = 0
            t["below_floor"] = False
    return st


@pytest.fixture()
def token_is() -> dict:
    return _statement("triton--token-is--nvidia-h200--20261203T201223Z--*")


def test_the_real_records_pass(token_is) -> None:
    assert spec_problems(token_is, PROJECT_ROOT) == []
    assert spec_problems(_statement("triton-fused--token-is--nvidia-h200--20261203T195733Z--*"), PROJECT_ROOT) == []


def test_a_fused_time_below_its_gemms_is_impossible() -> None:
    """e10: 0.6 ms at batch 16 for three GEMMs that need 52 ms at the BF16 peak (26 ms at FP8's): its DRAM floor
    alone (0.49 ms) let it through."""
    st = _faster(_statement("triton-fused--token-is--nvidia-h200--20261203T195733Z--*"), 600_000)
    problems = spec_problems(st, PROJECT_ROOT)
    assert any(p.startswith("seed-b16 full: median 600000 ns is below the strict floor") for p in problems), problems


def test_kind_cpu_does_not_escape_the_gpus_floor(token_is) -> None:
    """e4: kind "cpu" skipped the floor while the report still ranked the record under the H200."""
    st = _faster(token_is, 100_000)
    st["predicate"]["hardware"]["device"]["kind"] = "cpu"
    problems = spec_problems(st, PROJECT_ROOT)
    assert any("kind is 'cpu' but the record names the GPU h200-sxm" in p for p in problems), problems
    assert any("below the strict floor" in p for p in problems), problems


def test_names_that_disagree_are_refused(token_is) -> None:
    """e5: the floor came from device.name ("GPU-0": no entry, no floor), the section from device_name."""
    st = _faster(token_is, 100_000)
    hw = st["predicate"]["hardware"]
    hw["catalogue"], hw["device"]["name"] = None, "GPU-0"
    problems = spec_problems(st, PROJECT_ROOT)
    assert any("'GPU-0' resolves to no catalogue GPU while the record's other names say h200-sxm" in p
               for p in problems), problems
    other = _faster(_statement("triton--token-is--nvidia-h200--20261203T201223Z--*"), 100_000)
    other["predicate"]["hardware"]["device_name"] = "NVIDIA A100-SXM4-80GB"
    assert any("resolve to different GPUs" in p for p in spec_problems(other, PROJECT_ROOT))


def test_a_look_alike_gpu_name_is_refused(token_is) -> None:
    """e6: a Cyrillic "Н" made a section that read as the H200's, with no floor (the catalogue knew no such GPU)."""
    st = _faster(token_is, 100_000)
    st["predicate"]["hardware"]["catalogue"]["name"] = "NVIDIA \u041d200 SXM"
    problems = spec_problems(st, PROJECT_ROOT)
    assert any("hardware.catalogue.name" in p and "outside printable ASCII" in p for p in problems), problems


def test_an_unknown_protocol_is_refused(token_is) -> None:
    """e8: "fuII" (capital i) got no floor and a ranked table of its own."""
    st = _faster(token_is, 100_000)
    for w in st["predicate"]["workloads"]:
        for t in w.get("timings", []):
            t["protocol"] = "fuII"
    problems = spec_problems(st, PROJECT_ROOT)
    assert any("timing protocol 'fuII' is none of forward, full, full-scaled, backward" in p for p in problems)
