"""grpo-conform as a user in another repository gets it: a built wheel (specs inside, byte for byte),
installed non-editable in a fresh venv, run by action.yml's own step scripts on a temporary git
repository holding a copied implementation and one written by `grpo-conform init`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ROOT

SEED_IDENTITY = "a1591ee3a750b87738c7867f73e7e3300b6635eecca8229b45a7a1803e1c171f"
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "grpo_conform", "specs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (no build/ or egg-info left in the checkout)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    # Without build isolation where setuptools is here (no index needed); isolated otherwise.
    isolation = ["--no-build-isolation"] if _has("setuptools") else []
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(out), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (whl,) = out.glob("grpo_conform-*.whl")
    return whl


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_wheel_carries_the_specs_byte_for_byte(wheel):
    from grpo_conform.canonical import identity

    with zipfile.ZipFile(wheel) as z:
        packaged = {Path(n).name: z.read(n) for n in z.namelist() if re.fullmatch(r"grpo_conform/specs/[^/]+\.json", n)}
        names = set(z.namelist())
    source = {p.name: p.read_bytes() for p in (ROOT / "specs").glob("*.json")}
    assert packaged.keys() == source.keys()
    for name, data in source.items():  # identities never drift between the checkout and the install
        assert hashlib.sha256(packaged[name]).digest() == hashlib.sha256(data).digest(), name
    assert identity(json.loads(packaged["grpo-token-is.v1.json"])) == SEED_IDENTITY
    assert {"grpo_conform/schemas/spec.schema.json", "grpo_conform/evidence/trust/1.root.json"} <= names


def _action_steps() -> list[dict]:
    import yaml

    return yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]


def _substitute(value: str, inputs: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        expr = m.group(1).strip()
        if expr == "github.action_path":
            return str(ROOT)
        assert expr.startswith("inputs."), expr
        return inputs[expr[len("inputs."):]]

    return re.sub(r"\$\{\{(.*?)\}\}", one, str(value))


def run_action(repo: Path, venv_bin: Path, given: dict[str, str], tmp: Path) -> tuple[int, dict[str, str]]:
    """action.yml's `run` steps as the runner would run them (bash -e, pipefail; `if` on inputs)."""
    import yaml

    action = yaml.safe_load((ROOT / "action.yml").read_text())
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    inputs.update(given)
    output, summary = tmp / "github-output", tmp / "step-summary"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv_bin}{os.pathsep}{env['PATH']}", GITHUB_OUTPUT=str(output), GITHUB_STEP_SUMMARY=str(summary))
    code = 0
    for step in action["runs"]["steps"]:
        if "run" not in step:
            continue  # `uses:` steps (the artifact upload) belong to the runner
        cond = step.get("if")
        if cond and not re.fullmatch(r"inputs\.install == 'true'", cond):
            raise AssertionError(f"unknown step condition {cond!r}: teach this test")
        if cond and inputs["install"] != "true":
            continue
        step_env = {**env, **{k: _substitute(v, inputs) for k, v in step.get("env", {}).items()}}
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=repo,
                           env=step_env, capture_output=True, text=True, timeout=600)
        code = r.returncode
        print(f"--- step {step['name']!r}: exit {code}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
        if code != 0 and step.get("id") != "check":
            raise AssertionError(f"step {step['name']!r} failed ({code}):\n{r.stdout}\n{r.stderr}")
        if step.get("id") == "check":
            break
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return code, outputs


@pytest.fixture
def venv_dir():
    """A venv the worker's user can reach: run as root, the worker drops to `nobody`, which cannot enter
    pytest's 0700 /tmp/pytest-of-root (a runner's venv is not under a private folder either)."""
    base = Path(tempfile.mkdtemp(prefix="grpo-conform-venv-"))
    base.chmod(0o755)
    yield base / "venv"
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_installed_wheel_checks_implementations_in_another_repository(wheel, tmp_path, venv_dir):
    venv = venv_dir
    _make_venv(venv)
    bin_ = venv / "bin"
    repo = tmp_path / "kernels"
    (repo / "implementations").mkdir(parents=True)
    shutil.copytree(ROOT / "implementations" / "pytorch", repo / "implementations" / "pytorch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bin_}{os.pathsep}{env['PATH']}"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)

    _install_and_init(repo, bin_, wheel, env, git)
    code, outputs = run_action(repo, bin_, {
        "package": str(wheel), "pip-args": "--no-deps", "pip-extras": "", "install": "true",
        "implementations": "implementations/", "device": "cpu", "workloads": "batch1-seq1",
        "extra-args": "--member token-is"}, tmp_path)
    report = json.loads((repo / "grpo-conform-out" / "report.json").read_text())
    assert code == 0 and outputs["exit-code"] == "0", report
    # the installed package answered, not this checkout, and found the specs inside itself
    where = subprocess.run([str(bin_ / "python"), "-c", "import grpo_conform.spec as s; print(s.__file__); "
                            "print([str(d) for d in s.spec_dirs()])"], cwd=repo, env=env, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert where[0].startswith(str(venv)) and str(venv) in where[1] and str(ROOT) not in where[1], where
    impls = {i["name"]: i for i in report["implementations"]}
    assert set(impls) == {"pytorch", "starter"} and all(i["status"] == "conformant" for i in impls.values()), impls
    assert (repo / "grpo-conform-out" / "junit.xml").is_file() and (tmp_path / "step-summary").read_text()
    assert list((repo / "grpo-conform-out" / "evidence").glob("*.intoto.json"))


def _make_venv(venv: Path) -> None:
    """A fresh venv that sees the packages of the environment running the tests (torch, rich, ...: the
    wheel is installed --no-deps). `--system-site-packages` alone gives the base interpreter's packages,
    not a venv's: CI runs the suite in a venv, and on a machine whose base Python has none of them the
    installed CLI could not import rich. So the running environment's site-packages are added by a .pth
    file (a plain path: .pth files inside it, the editable install of this checkout among them, are not
    read, so the package still comes from the wheel). Without ensurepip where the venv's python already
    finds a pip that way: ensurepip's install of pip into the venv was 5-7 s of this test's ~28 s, and
    which copy of pip installs the wheel into the venv is not what the test is about."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    running = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    site_packages = next((venv / "lib").glob("python*/site-packages"))
    (site_packages / "running-environment.pth").write_text("".join(p + "\n" for p in running))
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=True, capture_output=True, timeout=300)


def _install_and_init(repo: Path, bin_: Path, wheel: Path, env: dict[str, str], git: list[str]) -> None:
    """`grpo-conform init` from the installed package writes the second implementation; then commit.
    (The action installs the wheel again: pip sees it is there.)"""
    subprocess.run([str(bin_ / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], env=env, check=True,
                   timeout=300)
    r = subprocess.run([str(bin_ / "grpo-conform"), "init", "token-is", "implementations/starter"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "kernels"], cwd=repo, check=True)


def test_spec_file_with_member_selects_that_member_of_a_family():
    """`check --spec specs/grpo.v1.json --member NAME` was refused ('a spec family; name a member')."""
    from grpo_conform.check import CheckRequest
    from grpo_conform.gate.plan import build_plan

    request = CheckRequest((str(ROOT / "implementations" / "pytorch"),), device="cpu",
                           spec_path=str(ROOT / "specs" / "grpo.v1.json"), members=("token-offpolicy-mask",))
    plan = build_plan(request, SimpleNamespace(type="cpu"))
    (impl,) = plan.implementations
    assert [m.spec.id for m in impl.members] == ["grpo/token-offpolicy-mask"]


def test_a_family_that_is_nowhere_says_where_it_looked(tmp_path, monkeypatch):
    from grpo_conform.implementations import ManifestError, load_implementation
    from grpo_conform.spec import specs_for_manifest

    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "impl.py").write_text("def grpo_loss(**kw):\n    pass\n")
    (folder / "implementation.toml").write_text(
        'name = "k"\nspec = "grpo"\nmembers = ["token-is"]\nentry = "impl:grpo_loss"\nlanguage = "python"\n'
        'license = "MIT"\ndevices = ["cpu"]\ndescription = "d"\n')
    with pytest.raises(ManifestError, match="no spec family 'grpo' found.*GRPO_CONFORM_SPECS") as exc:
        specs_for_manifest(load_implementation(str(folder)), dirs=[tmp_path])
    assert "drop 'members'" not in str(exc.value)
    monkeypatch.setenv("GRPO_CONFORM_SPECS", str(ROOT / "specs"))
    monkeypatch.chdir(tmp_path)
    from grpo_conform.spec import spec_dirs

    assert spec_dirs()[0] == ROOT / "specs"
