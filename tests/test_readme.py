"""The README's test commands are what CI runs (.ci/run), so its "Run the tests" cannot drift."""

from __future__ import annotations

import re

from conftest import ROOT


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if "pytest" in line or "'.[" in line]


def test_readme_test_commands_are_the_ci_commands():
    """README's test command is .ci/run's: both lanes in one pytest run (docs/timing.md, "Fourth pass":
    one start and one collection, no idle tail), and the peers lane's install and run."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = _readme_commands()
    pytest_lines = [c for c in commands if "pytest" in c and "-m peers" not in c]
    lanes = [m.group(1) if (m := re.search(r' -m "([^"]+)"', c)) else None for c in pytest_lines]
    assert lanes == [None], pytest_lines  # both lanes in one run, as .ci/run runs them
    for c in pytest_lines:
        assert re.search(rf"^{re.escape(c)} \|\|", ci, re.M), c
    install = [c for c in commands if c.startswith("python3 -m pip install -e '.[triton,liger,test]'")]
    assert install and install[0] in ci
    (peers,) = [c for c in commands if "-m peers" in c]
    pip, pytest = peers.split(" && ")
    assert pip.replace("python3 -m pip install -e", "python3 -m pip install -q -e") in ci
    assert pytest in ci, pytest


def test_readme_manifest_is_the_member_manifest_in_full():
    """The README's implementation.toml names every manifest key and validates as written."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from grpo_conform.implementations import Manifest

    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, re.S)
    data = tomllib.loads(block)
    assert set(data) == set(Manifest.model_fields), set(Manifest.model_fields) ^ set(data)
    assert Manifest(**data).members
