"""Interrupts: Ctrl-C (SIGINT) and CI cancellation (SIGTERM) end a run cleanly.

SIGINT raises KeyboardInterrupt and SIGTERM raises `Terminated` (both BaseException, so no
`except Exception` swallows them); the `finally` blocks of the run close every worker session,
which kills the worker's process group and removes its private directory. The CLI then exits
130 (SIGINT) or 143 (SIGTERM, 128 + 15), the shells' conventions, distinct from 1 (failed).
"""

from __future__ import annotations

import signal

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(BaseException):
    """SIGTERM arrived (CI cancelled the job)."""


def _raise_terminated(signum, frame):  # noqa: ARG001
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one cleanup, whatever else arrives
    raise Terminated()


def install_handlers() -> None:
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)
