"""What issue 34 asks of `merge` for scale-out: shards of one run, one tree, one GPU model, one
software stack. Missing and duplicate shard indices and mixed GPU models are refused today
(tests/test_gate.py); mixed software identities are the evidence work's (h/evidence makes merge a
checker). Until that lands, the test below is an expected failure; `strict=True` turns it into a
failure the day merge refuses, so whoever merges must drop the xfail mark then."""

from __future__ import annotations

import json

import pytest

from grpo_conform.errors import GrpoConformError
from grpo_conform.gate.merge import MergeRequest, run_merge
from test_gate import _impl, _report, _workload


def _shards(tmp_path, software: list[dict], devices: list[dict] | None = None) -> list[str]:
    paths = []
    for i, soft in enumerate(software, start=1):
        doc = dict(_report(_impl(f"k{i}", [_workload("odd-vocab")], identity=f"{i}" * 64)).to_json(),
                   shard=f"{i}/{len(software)}", software=soft)
        if devices:
            doc["device"] = devices[i - 1]
        (tmp_path / f"shard-{i}.json").write_text(json.dumps(doc))
        paths.append(str(tmp_path / f"shard-{i}.json"))
    return paths


def test_merge_accepts_shards_of_one_software_stack(tmp_path):
    same = {"python": "3.11.7", "torch": "2.13.0", "grpo_conform": "0.1.0"}
    report = run_merge(MergeRequest(tuple(_shards(tmp_path, [same, same]))))
    assert sorted(i.name for i in report.implementations) == ["k1", "k2"]


def test_merge_refuses_shards_of_different_software(tmp_path):
    a = {"python": "3.11.7", "torch": "2.13.0", "grpo_conform": "0.1.0"}
    b = dict(a, torch="2.12.1")  # one node of the cluster had another torch
    with pytest.raises(GrpoConformError, match="(?i)software|torch"):
        run_merge(MergeRequest(tuple(_shards(tmp_path, [a, b]))))


def test_merge_refuses_shards_of_different_gpu_models(tmp_path):
    soft = {"python": "3.11.7", "torch": "2.13.0"}
    devices = [{"kind": "cuda", "name": "NVIDIA H200"}, {"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB"}]
    with pytest.raises(GrpoConformError, match="different devices|GPU"):
        run_merge(MergeRequest(tuple(_shards(tmp_path, [soft, soft], devices))))


@pytest.mark.xfail(strict=True, reason="merge counts a shard by its pieces; an empty shard has none (issue 34)")
def test_merge_counts_a_shard_that_had_no_unit(tmp_path):
    """N larger than the units: shard 2/2 ran nothing, and said so in a report of no implementation."""
    soft = {"python": "3.11.7", "torch": "2.13.0"}
    (one,) = _shards(tmp_path, [soft])
    doc = json.loads(open(one).read())
    doc["shard"] = "1/2"
    (tmp_path / "shard-1.json").write_text(json.dumps(doc))
    (tmp_path / "shard-2.json").write_text(json.dumps(dict(doc, shard="2/2", implementations=[])))
    report = run_merge(MergeRequest((one, str(tmp_path / "shard-2.json"))))
    assert [i.name for i in report.implementations] == ["k1"]
