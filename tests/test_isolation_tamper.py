"""`tamper-scan`: the static tripwire over an implementation's source, run in the parent without
importing anything; the bundled implementations must not trip it."""

from __future__ import annotations

import pytest

from conftest import ROOT
from grpo_conform.checks.registry import CHECKS_BY_NAME, CONFORMANCE_CHECKS
from grpo_conform.checks.tamper import scan_python, tamper_scan
from grpo_conform.implementations import MANIFEST, load_implementation

FLAGGED = {
    "import grpo_conform.isolation.worker as w": "imports grpo_conform",
    "from grpo_conform.checks import book": "imports from grpo_conform",
    "import __main__": "imports __main__",
    "import ctypes": "imports ctypes",
    "from ctypes import CDLL": "imports from ctypes",
    "m = __import__('ct' 'ypes')": "string mentions 'ctypes'",
    "import sys\nsys.modules['torch'] = None": "assigns sys.modules",
    "import sys\ndel sys.modules['torch']": "deletes sys.modules",
    "import sys\nsys.modules.update({})": "sys.modules.update",
    "import gc\nobjs = gc.get_objects()": "gc.get_objects",
    "import sys\nf = sys._getframe(1)": "sys._getframe",
    "def f(frame):\n    return frame.f_back.f_globals": "f_back",
    "p = '/proc/%d/mem' % 1": "/proc/",
    "x = 'PTRACE_ATTACH'": "ptrace",
    "libc.ptrace(16, 1, 0, 0)": "ptrace",
    "main = sys.modules.get('__main__')": "'__main__'",
}
CLEAN = [
    "import torch\n\nif __name__ == '__main__':\n    print(1)\n",
    "import gc\ngc.collect()\n",
    "import sys\nmods = dict(sys.modules)\nx = sys.modules.get('torch')\n",
    "# ctypes, /proc/ and grpo_conform in a comment are not code\nx = 1\n",
    "def f(x):\n    return x  # ptrace\n",
]


@pytest.mark.parametrize("source", list(FLAGGED), ids=range(len(FLAGGED)))
def test_what_the_scan_flags(source):
    found = scan_python(source)
    want = FLAGGED[source]
    if want is None:
        assert found == [], found
    else:
        assert found and any(want in what for _, what in found), found


@pytest.mark.parametrize("source", CLEAN, ids=range(len(CLEAN)))
def test_what_the_scan_leaves_alone(source):
    assert scan_python(source) == []


def test_a_file_that_does_not_parse_is_scanned_as_text():
    assert scan_python("def broken(:\n    open('/proc/1/mem')\n") == [(2, "mentions '/proc/'")]


@pytest.mark.parametrize("name", ["pytorch", "liger", "liger-inplace", "torch-compile", "triton"])
def test_the_bundled_implementations_pass(name):
    outcome = tamper_scan(load_implementation(ROOT / "implementations" / name))
    assert outcome.status == "pass", outcome.message


def test_a_failure_names_the_lines_and_nothing_is_imported(tmp_path):
    folder = tmp_path / "tampers"
    folder.mkdir()
    (folder / MANIFEST).write_text(
        'name = "tampers"\nspec = "grpo-token-is"\nentry = "impl:grpo_loss"\nlanguage = "python"\n'
        'license = "MIT"\ndevices = ["cpu"]\ndescription = "tampers"\n')
    marker = tmp_path / "ran"
    (folder / "impl.py").write_text(f"open({str(marker)!r}, 'w')\nimport ctypes\n\n\ndef grpo_loss(**kw):\n"
                                    "    return ctypes\n")
    (folder / "notes.txt").write_text("see /proc/self/maps\n")
    outcome = tamper_scan(load_implementation(folder))
    assert outcome.status == "fail" and "impl.py:2" in outcome.message and "import ctypes" in outcome.message
    where = {(f["file"], f["line"]) for f in outcome.evidence["findings"]}
    assert ("impl.py", 2) in where and ("notes.txt", 1) in where
    assert not marker.exists()  # scanned, never imported


def test_the_check_is_registered_static():
    info = CHECKS_BY_NAME["tamper-scan"]
    assert info.static and "tamper-scan" not in CONFORMANCE_CHECKS
