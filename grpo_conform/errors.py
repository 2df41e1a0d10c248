"""The one base class of every error the library raises on purpose.

Each module defines its own subclasses next to the code that raises them. The CLI turns a
`GrpoConformError` into a message and its `exit_code`; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

#: Exit codes of the CLI (a contract: CI systems rely on them).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3


class GrpoConformError(Exception):
    """A problem the user can fix; its message says what is wrong and what to do."""

    exit_code: int = EXIT_USAGE


class EnvironmentProblem(GrpoConformError):
    """The machine cannot do what was asked (no CUDA device, a missing package)."""

    exit_code = EXIT_ENVIRONMENT
