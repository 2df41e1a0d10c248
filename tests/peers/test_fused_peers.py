"""The fused-linear peer on TRL's own kernel (implementations/fused-trl: `trl.kernels.ChunkedLogProbFunction`
then the loss) through `grpo-conform check`, end to end in a worker: conformant on the KL-through-a-
reference-weight member and the sequence-level one at odd sizes (21 rows, seq 7, vocab 1003: no block
divides them), and the same folder with the temperature left out of TRL's call must fail the gradient.
In the peers lane because it needs TRL (`pip install -e '.[peers]'`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from peers.peer_lane import require

pytestmark = pytest.mark.peers
ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "implementations" / "fused-trl"
MEMBERS = ("token-offpolicy-mask-kl-ref-weight", "sequence-offpolicy-mask")


def _check(folder: Path, checks: tuple[str, ...] = ()):
    from grpo_conform.check import CheckRequest, run_check

    return run_check(CheckRequest((str(folder),), device="cpu", workloads=("odd-bf16",), members=MEMBERS,
                                  checks=checks))


def test_trl_s_fused_lm_head_route_is_conformant():
    require("trl")
    report = _check(FOLDER)
    (impl,) = report.implementations
    failed = [(w.workload, o.check, o.message) for w in impl.workloads for o in w.outcomes if o.failed]
    assert report.exit_code == 0 and not failed, failed


def test_the_route_without_its_temperature_fails_the_gradient(tmp_path):
    require("trl")
    wrong = tmp_path / "fused-trl-no-temperature"
    shutil.copytree(FOLDER, wrong)
    impl = wrong / "impl.py"
    text = impl.read_text()
    assert text.count("temperature, CHUNK") == 2  # both calls of TRL's function
    impl.write_text(text.replace("temperature, CHUNK", "1.0, CHUNK"))
    report = _check(wrong, checks=("loss", "gradient"))
    outcomes = {o.check: o for w in report.implementations[0].workloads for o in w.outcomes}
    assert report.exit_code == 1 and outcomes["gradient"].failed, outcomes["gradient"].message
