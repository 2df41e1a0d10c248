"""Data files shipped with the package (the GPU catalogue, gpus.json)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

GPUS_FILE = "gpus.json"


def data_path(name: str) -> Path:
    """Filesystem path of a packaged data file (for messages that name the file)."""
    return Path(str(resources.files(__name__).joinpath(name)))


def read_text(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
