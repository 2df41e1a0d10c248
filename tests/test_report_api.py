"""The Python API: `grpo_conform.testing.assert_conforms` (isolated like `check`, AssertionError with
the evidence) and `grpo_conform.check(...)` returning the report object; errors an author can act on."""

from __future__ import annotations

import re

import importlib
import shutil
import sys
import textwrap

import pytest

import grpo_conform
from conftest import GALLERY
from grpo_conform.testing import assert_conforms

ROOT = GALLERY.parent.parent
WL = ["odd-vocab"]

RAISES_LOUDLY = '''
import sys


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    for i in range(3000):  # 300 KB of chatter: more than the validator keeps
        print(f"autotune step {i:5d} " + "." * 80)
    print("kernel: picking a block size for vocab", logits.shape[-1], file=sys.stderr)
    return _pick_block(logits.shape[-1])


def _pick_block(vocab):
    raise ValueError(f"no block size divides vocab {vocab}")
'''


@pytest.fixture
def loud_folder(tmp_path):
    folder = tmp_path / "loud"
    folder.mkdir()
    (folder / "impl.py").write_text(RAISES_LOUDLY)
    (folder / "implementation.toml").write_text(textwrap.dedent('''\
        name = "loud"
        spec = "grpo-token-is"
        entry = "impl:grpo_loss"
        language = "python"
        license = "Apache-2.0"
        devices = ["cpu", "cuda"]
        description = "prints, then raises two frames deep"
    '''))
    return folder


@pytest.mark.slow
def test_assert_conforms_passes_a_conformant_file(tmp_path):
    shutil.copy(ROOT / "implementations" / "pytorch" / "impl.py", tmp_path / "my_kernel.py")
    assert assert_conforms(f"{tmp_path / 'my_kernel.py'}:grpo_loss", device="cpu", workloads=WL) is None


@pytest.mark.slow
def test_assert_conforms_raises_with_the_root_cause_for_a_callable(tmp_path, monkeypatch):
    shutil.copy(GALLERY / "bf16-arithmetic" / "impl.py", tmp_path / "bf16_kernel.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = importlib.import_module("bf16_kernel").grpo_loss
    with pytest.raises(AssertionError) as info:
        assert_conforms(fn, device="cpu", workloads=WL)
    text = str(info.value)
    first = text.splitlines()[1]
    assert first.startswith("first failure: ") and "/ gradient (fail): " in first
    assert "worst:" in text and "index=[" in text  # the evidence, not just a verdict
    sys.modules.pop("bf16_kernel", None)


@pytest.mark.slow
def test_an_exception_shows_its_traceback_and_the_output_tail(loud_folder):
    with pytest.raises(AssertionError) as info:
        assert_conforms(loud_folder, device="cpu", workloads=WL)
    text = str(info.value)
    assert 'File "impl.py", line 9, in grpo_loss' in text  # the author's frames, with the author's file names
    assert 'File "impl.py", line 13, in _pick_block' in text
    assert "ValueError: no block size divides vocab 5003" in text
    assert re.search(r"kernel: picking a block size for vocab \d+", text)  # what it printed before it raised
    assert "isolation/worker.py" not in text
    assert "earlier bytes of output not shown" in text and len(text) < 60_000  # capped, and said so


def test_worker_output_is_capped_in_memory():
    import os

    from grpo_conform.isolation.output_tail import OutputTail

    tail = OutputTail(keep=1000)
    for i in range(200):
        os.write(tail.write_fd, f"line {i:04d} ".encode() * 10)
    tail.close()
    text = tail.tail(200)
    assert tail.total == 200 * 100 and len(tail._buf) == 1000
    assert text.startswith("[... 19,800 earlier bytes of output not shown]") and text.endswith("line 0199 ")


@pytest.mark.slow
def test_check_returns_the_report_object(loud_folder):
    report = grpo_conform.check(str(loud_folder), device="cpu", workloads=WL)
    assert report.exit_code == 1
    (impl,) = report.implementations
    assert impl.status == "failed" and report.to_json()["implementations"][0]["name"] == "loud"
    assert callable(grpo_conform.check) and hasattr(grpo_conform.check, "run_check")  # module and function


def test_the_tail_taken_right_after_a_write_holds_that_write():
    # The worker prints its clue and replies at once; the tail taken on the reply must hold the clue.
    import os

    from grpo_conform.isolation.output_tail import OutputTail

    tail = OutputTail(keep=1 << 16)
    try:
        for i in range(300):
            os.write(tail.write_fd, b"." * 5000 + f"clue {i}\n".encode())
            assert tail.tail(200).endswith(f"clue {i}\n")
    finally:
        tail.close()
