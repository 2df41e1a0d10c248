"""Ships specs/*.json inside the package (grpo_conform/specs/) so an installed wheel finds them.

specs/ stays the one source (docs, manifests and records name `specs/...`); this copy is made at
build time, byte for byte, so an identity (sha256 of the canonical JSON) is the same installed or
not. tests/test_packaging.py builds the wheel and compares the copies.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithSpecs(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "grpo_conform" / "specs"
        self.mkpath(str(target))
        for spec in sorted((ROOT / "specs").glob("*.json")):
            self.copy_file(str(spec), str(target / spec.name), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        target = Path(self.build_lib) / "grpo_conform" / "specs"
        return super().get_outputs(include_bytecode) + [str(target / s.name) for s in sorted((ROOT / "specs").glob("*.json"))]


setup(cmdclass={"build_py": BuildWithSpecs})
