"""Implementation folders: the manifest contract, errors that name file and field, the folder
identity (the documented coreutils recipe), and import-time failures reported as load errors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, cli_here
from grpo_conform.implementations import MANIFEST, ManifestError, folder_listing, load_implementation

MANIFEST_TEXT = """\
name = "sample"
spec = "grpo-token-is"
entry = "impl:grpo_loss"
language = "python"
license = "MIT"
devices = ["cpu"]
description = "a sample implementation for the tests"
"""
IMPL_TEXT = "def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):\n" \
            "    raise NotImplementedError\n"


def _folder(tmp_path: Path, manifest: str = MANIFEST_TEXT, impl: str | None = IMPL_TEXT, name: str = "impl") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(manifest)
    if impl is not None:
        (folder / "impl.py").write_text(impl)
    return folder


@pytest.mark.parametrize("name", ["pytorch", "triton", "torch-compile", "liger", "liger-inplace"])
def test_bundled_folders_load(name):
    impl = load_implementation(ROOT / "implementations" / name)
    assert impl.name == name
    assert impl.manifest.spec == "grpo" and "token-is" in impl.manifest.members  # the family, seed member first
    assert impl.module_file.is_file()
    assert impl.path == (ROOT / "implementations" / name).resolve()
    assert len(impl.identity) == 64


def test_manifest_fields_are_read(tmp_path):
    text = MANIFEST_TEXT.replace('devices = ["cpu"]', 'devices = ["cpu", "cuda"]') + \
        'source = "https://example.org/x"\nrequires = ["math"]\n'
    impl = load_implementation(_folder(tmp_path, text))
    m = impl.manifest
    assert (m.name, m.entry, m.module, m.callable) == ("sample", "impl:grpo_loss", "impl", "grpo_loss")
    assert m.devices == ("cpu", "cuda") and m.requires == ("math",) and m.source == "https://example.org/x"
    assert m.license == "MIT" and m.language == "python"


def test_the_manifest_file_itself_may_be_named(tmp_path):
    folder = _folder(tmp_path)
    assert load_implementation(folder / MANIFEST).path == folder.resolve()


def test_a_dotted_entry_module_maps_to_a_subfolder(tmp_path):
    folder = _folder(tmp_path, MANIFEST_TEXT.replace("impl:grpo_loss", "pkg.kernel:grpo_loss"), impl=None)
    (folder / "pkg").mkdir()
    (folder / "pkg" / "kernel.py").write_text(IMPL_TEXT)
    impl = load_implementation(folder)
    assert impl.module_file == folder.resolve() / "pkg" / "kernel.py"


# -- errors name the file and the field ---------------------------------------------------------------
def _replace(old, new):
    return MANIFEST_TEXT.replace(old, new)


MANIFEST_ERRORS = {
    "missing description": (_replace('description = "a sample implementation for the tests"\n', ""), "description",
                            "missing required field"),
    "missing entry": (_replace('entry = "impl:grpo_loss"\n', ""), "entry", "missing required field"),
    "uppercase name": (_replace('name = "sample"', 'name = "Sample"'), "name",
                       "expected lowercase letters, digits and dashes, starting with a letter or digit"),
    "name with underscore": (_replace('name = "sample"', 'name = "my_impl"'), "name",
                             "expected lowercase letters, digits and dashes"),
    "entry without a colon": (_replace("impl:grpo_loss", "impl.grpo_loss"), "entry",
                              "expected 'module:callable', e.g. 'impl:grpo_loss'"),
    "entry with a file name": (_replace("impl:grpo_loss", "impl.py:grpo_loss"), "entry",
                               "module 'impl.py' not found: expected "),  # a dotted module: impl/py.py
    "unknown field": (MANIFEST_TEXT + 'colour = "red"\n', "colour",
                      "unknown field (allowed: name, spec, entry, language, license, devices, description, source, "
                      "requires, members)"),
    "empty devices": (_replace('devices = ["cpu"]', "devices = []"), "devices",
                      "expected at least one of 'cpu', 'cuda'"),
    "unknown device": (_replace('devices = ["cpu"]', 'devices = ["tpu"]'), "devices.0", "'cpu' or 'cuda'"),
    "bad license": (_replace('license = "MIT"', 'license = "do what you want"'), "license",
                    "expected an SPDX license id such as 'BSD-3-Clause'"),
    "two-line description": (_replace('"a sample implementation for the tests"', '"""one\ntwo"""'), "description",
                             "expected one non-empty line"),
    "blank description": (_replace('"a sample implementation for the tests"', '"   "'), "description",
                          "expected one non-empty line"),
}


@pytest.mark.parametrize("case", list(MANIFEST_ERRORS), ids=list(MANIFEST_ERRORS))
def test_manifest_errors_name_file_and_field(tmp_path, case):
    text, field, problem = MANIFEST_ERRORS[case]
    folder = _folder(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_implementation(folder)
    exc = info.value
    assert exc.file == str(folder / MANIFEST)
    assert exc.field == field
    assert problem in exc.problem, exc.problem
    assert str(exc) == f"{folder / MANIFEST}: field '{field}': {exc.problem}"
    assert exc.exit_code == 2


def test_no_manifest(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "impl.py").write_text(IMPL_TEXT)
    with pytest.raises(ManifestError) as info:
        load_implementation(folder)
    assert info.value.file == str(folder / MANIFEST) and info.value.field is None
    assert str(info.value) == f"{folder / MANIFEST}: missing: every implementation folder needs {MANIFEST} (see README)"


def test_no_folder_and_a_plain_file(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_implementation(tmp_path / "nowhere")
    assert str(info.value) == f"{tmp_path / 'nowhere'}: no such folder"
    (tmp_path / "file.py").write_text("")
    with pytest.raises(ManifestError) as info:
        load_implementation(tmp_path / "file.py")
    assert "expected a folder holding implementation.toml" in str(info.value)


def test_toml_syntax_error(tmp_path):
    folder = _folder(tmp_path, MANIFEST_TEXT.replace('license = "MIT"', 'license "MIT"'))
    with pytest.raises(ManifestError) as info:
        load_implementation(folder)
    assert info.value.file == str(folder / MANIFEST) and info.value.field is None
    assert info.value.problem.startswith("not valid TOML: ")
    assert "line 5" in info.value.problem


def test_module_file_missing(tmp_path):
    folder = _folder(tmp_path, impl=None)
    with pytest.raises(ManifestError) as info:
        load_implementation(folder)
    assert info.value.field == "entry"
    assert str(info.value) == (f"{folder / MANIFEST}: field 'entry': module 'impl' not found: expected "
                               f"{folder.resolve() / 'impl.py'}")


def test_symbolic_links_are_refused(tmp_path):
    folder = _folder(tmp_path)
    (folder / "link.py").symlink_to(folder / "impl.py")
    with pytest.raises(ManifestError) as info:
        load_implementation(folder)
    assert info.value.file == str(folder / "link.py") and "symbolic links are not allowed" in str(info.value)


# -- identity --------------------------------------------------------------------------------------
def _has_gnu_find() -> bool:
    if shutil.which("find") is None or shutil.which("sha256sum") is None:
        return False
    run = subprocess.run(["find", ".", "-maxdepth", "0", "-printf", "%P"], capture_output=True, text=True)
    return run.returncode == 0


RECIPE = ("find . -type f ! -path '*/__pycache__/*' -printf '%P\\n' | LC_ALL=C sort "
          "| xargs -d '\\n' sha256sum | sha256sum")


def _coreutils_identity(folder: Path) -> str:
    run = subprocess.run(["bash", "-c", RECIPE], cwd=folder, capture_output=True, text=True, check=True)
    digest, dash = run.stdout.split()
    assert dash == "-"
    return digest


needs_coreutils = pytest.mark.skipif(not _has_gnu_find(), reason="needs GNU find (-printf) and sha256sum")


def _rich_folder(tmp_path: Path) -> Path:
    folder = _folder(tmp_path)
    (folder / "Zeta.py").write_text("# upper case sorts before lower case in C order\n")
    (folder / "_helpers.py").write_text("X = 1\n")
    (folder / "name with spaces.txt").write_text("spaces\n")
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "sub" / "a.py").write_bytes(b"\x00\x01binary\xff")
    (folder / "sub" / "deeper" / "b.cu").write_text("__global__ void k() {}\n")
    (folder / "sub-dash.py").write_text("")  # '-' (0x2d) sorts before '/' (0x2f): sub-dash.py before sub/a.py
    for cache in (folder / "__pycache__", folder / "sub" / "__pycache__"):
        cache.mkdir()
        (cache / "impl.cpython-312.pyc").write_bytes(os.urandom(32))
    return folder


@needs_coreutils
@pytest.mark.parametrize("name", ["pytorch", "triton"])
def test_identity_of_bundled_folders_equals_the_coreutils_recipe(name):
    folder = ROOT / "implementations" / name
    assert load_implementation(folder).identity == _coreutils_identity(folder)


@needs_coreutils
def test_identity_equals_the_coreutils_recipe(tmp_path):
    folder = _rich_folder(tmp_path)
    impl = load_implementation(folder)
    assert impl.identity == _coreutils_identity(folder)
    lines = impl.listing.splitlines()
    names = [line.split("  ", 1)[1] for line in lines]
    assert names == sorted(names, key=lambda n: n.encode())
    assert "sub-dash.py" in names and names.index("sub-dash.py") < names.index("sub/a.py")
    assert not any("__pycache__" in n for n in names)
    assert impl.identity == hashlib.sha256(folder_listing(folder).encode()).hexdigest()


def test_identity_ignores_pycache(tmp_path):
    folder = _rich_folder(tmp_path)
    before = load_implementation(folder).identity
    (folder / "__pycache__" / "impl.cpython-312.pyc").write_bytes(b"different bytecode")
    (folder / "__pycache__" / "more.pyc").write_bytes(b"x")
    assert load_implementation(folder).identity == before


@pytest.mark.parametrize("change", ["edit", "add", "remove", "rename", "edit nested"])
def test_identity_changes_when_a_file_changes(tmp_path, change):
    folder = _rich_folder(tmp_path)
    before = load_implementation(folder).identity
    if change == "edit":
        (folder / "impl.py").write_text(IMPL_TEXT + "# one more line\n")
    elif change == "add":
        (folder / "notes.md").write_text("")
    elif change == "remove":
        (folder / "_helpers.py").unlink()
    elif change == "rename":
        (folder / "_helpers.py").rename(folder / "_helper.py")
    else:
        (folder / "sub" / "deeper" / "b.cu").write_text("__global__ void k() { }\n")
    assert load_implementation(folder).identity != before


# -- import-time failures, through the CLI ---------------------------------------------------------------
IMPORT_FAILURES = {
    "import-error": ("import grpo_conform_no_such_module_xyz\n", "ModuleNotFoundError: No module named "
                     "'grpo_conform_no_such_module_xyz' (impl.py:1)"),
    "no-entry": ("def something_else():\n    pass\n", "AttributeError: module 'impl' has no callable 'grpo_loss'"),
    "not-callable": ("grpo_loss = 42\n", "AttributeError: module 'impl' has no callable 'grpo_loss'"),
    "sys-exit": ("import sys\nsys.exit(3)\n", "SystemExit: 3 (impl.py:2)"),
    "syntax-error": ("def grpo_loss(:\n", "SyntaxError"),
}


def _check_cli(*folders: Path) -> subprocess.CompletedProcess:
    """`check` in this process (conftest.cli_here: $COLUMNS 1000, the CLI's consoles sized to it as a new
    process sizes them)."""
    return cli_here("check", *folders, "--device", "cpu", "--workload", "batch1-seq1", "--no-evidence")


@pytest.fixture(scope="module")
def import_failures():
    """One `check` of the five folders and a deep one together (one validator: a CLI process per folder
    cost ~7 s CPU, most of it starting python, torch and the zygote; in this process since 2026-12-03,
    docs/timing.md "Fourth pass"); each test reads its folder's line."""
    path = Path(tempfile.mkdtemp(prefix="gc", dir="/tmp" if os.path.isdir("/tmp") else None))  # short: no wrap
    folders = {case: _folder(path, MANIFEST_TEXT.replace('"sample"', f'"{case}"'), source, name=case)
               for case, (source, _detail) in IMPORT_FAILURES.items()}
    folders["long"] = _folder(path / ("deep" * 20), MANIFEST_TEXT, "import grpo_conform_no_such_module_xyz\n", name="f")
    yield folders, _check_cli(*folders.values())
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(IMPORT_FAILURES), ids=list(IMPORT_FAILURES))
def test_import_time_failures_are_load_errors(import_failures, case):
    folders, run = import_failures
    folder, (_source, detail) = folders[case], IMPORT_FAILURES[case]
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert sum("implementation.toml" in line for line in run.stdout.splitlines()) == len(folders), run.stdout
    lines = [line.strip() for line in run.stdout.splitlines() if str(folder / MANIFEST) in line]
    assert len(lines) == 1, run.stdout
    (line,) = lines
    assert line.startswith(f"{folder / MANIFEST}: field 'entry': cannot load impl:grpo_loss: ")
    assert detail in line, run.stdout
    assert "LOAD-ERROR" in run.stdout and "exit code 2" in run.stdout


@pytest.mark.slow
def test_a_long_load_error_stays_on_one_line(import_failures):
    folders, run = import_failures
    assert run.returncode == 2
    lines = [line.strip() for line in run.stdout.splitlines() if str(folders["long"] / MANIFEST) in line]
    assert len(lines) == 1 and lines[0].endswith("(impl.py:1)"), run.stdout


@pytest.mark.slow
def test_import_time_failure_in_json(tmp_path):
    folder = _folder(tmp_path, MANIFEST_TEXT, "raise RuntimeError('boom at import')\n", name="f")
    run = cli_here("check", folder, "--device", "cpu", "--workload", "batch1-seq1", "--no-evidence", "--format", "json")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    report = json.loads(run.stdout)
    (impl,) = report["implementations"]
    assert impl["status"] == "load-error" and impl["workloads"] == []
    assert impl["message"] == (f"{folder / MANIFEST}: field 'entry': cannot load impl:grpo_loss: RuntimeError: "
                               "boom at import (impl.py:1)")
    assert report["exit_code"] == 2
