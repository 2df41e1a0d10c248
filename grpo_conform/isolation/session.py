"""The parent side of a worker: spawn it with a clean environment, talk to it with timeouts,
and turn deaths, hangs and exceptions into typed failures carrying the tail of its stderr.

A worker is `python -m grpo_conform.isolation.worker FD` started with subprocess in a new
session (so a hang is ended by killing its whole process group), with stdout and stderr in a
file of the session's private directory, and an environment built from an allow-list: no key
material, no seeds, nothing named like a secret, no GRPO_CONFORM_* variables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

import grpo_conform
from grpo_conform.errors import GrpoConformError
from grpo_conform.implementations import Implementation, ManifestError
from grpo_conform.isolation.sharing import SharedAllocator, private_dir

STDERR_TAIL = 4000
_ALLOWED = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|LANG|LC_[A-Z]+|TMPDIR|TZ|LD_LIBRARY_PATH|VIRTUAL_ENV|CONDA_PREFIX|"
    r"CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|TRITON_[A-Z_]+|TORCH_[A-Z_]+|TORCHINDUCTOR_[A-Z_]+|PYTORCH_[A-Z_]+|"
    r"NCCL_[A-Z_]+|NVSHMEM_[A-Z_]+|XDG_CACHE_HOME|CC|CXX|OMP_NUM_THREADS|MKL_[A-Z_]+|SSL_CERT_FILE)$"
)
_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|SEED", re.IGNORECASE)


class WorkerFailure(GrpoConformError):
    """The implementation's process did not answer as it should; `kind` says how."""

    exit_code = 1

    def __init__(self, kind: str, message: str, stderr_tail: str = "", error: dict | None = None):
        self.kind, self.stderr_tail, self.error = kind, stderr_tail, error or {}
        super().__init__(message)

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": str(self)}
        if self.error:
            out["error"] = self.error
        if self.stderr_tail:
            out["stderr_tail"] = self.stderr_tail
        return out


class ImplementationLoadError(ManifestError):
    """The implementation's module failed to import, or its entry is not a callable."""


def worker_environment(device: str, interpret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ALLOWED.match(k) and not _SECRET.search(k)}
    package_root = str(Path(grpo_conform.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in sys.path if p and os.path.isdir(p)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        # Keep freed heap memory for reuse, so the allocator poison reaches fresh CPU tensors.
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 32)
        env["MALLOC_TRIM_THRESHOLD_"] = str(1 << 36)
        env["MALLOC_TOP_PAD_"] = "0"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


@dataclass
class WorkerSession:
    """One worker process for one implementation. Use as a context manager."""

    impl: Implementation
    parameters: dict[str, Any]
    device: torch.device
    timeout: float
    interpret: bool = False
    directory: Path = field(default_factory=private_dir)
    proc: subprocess.Popen | None = None
    conn: Connection | None = None
    info: dict[str, Any] = field(default_factory=dict)
    _log: Path | None = None

    def __post_init__(self) -> None:
        self.allocator = SharedAllocator(self.directory, self.device)

    # -- lifetime ---------------------------------------------------------------------------
    def __enter__(self) -> "WorkerSession":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        self._log = self.directory / "worker.log"
        with open(self._log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "grpo_conform.isolation.worker", str(child_sock.fileno())],
                env=worker_environment(self.device.type, self.interpret),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,
            )
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        reply = self.request(
            op="load",
            folder=str(self.impl.path),
            name=self.impl.name,
            entry=self.impl.manifest.entry,
            parameters=self.parameters,
            device=self.device.type,
        )
        self.info = reply.get("info", {})

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._send({"op": "exit"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, WorkerFailure):
                pass
        self._kill()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def _kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    # -- messages ---------------------------------------------------------------------------
    def stderr_tail(self) -> str:
        if self._log is None or not self._log.exists():
            return ""
        data = self._log.read_bytes()[-STDERR_TAIL:]
        return data.decode("utf-8", errors="replace")

    def _send(self, msg: dict[str, Any]) -> None:
        if self.conn is None:
            raise WorkerFailure("crash", "the worker is not running")
        try:
            self.conn.send_bytes(json.dumps(msg).encode())
        except OSError:
            raise self._died() from None

    def _died(self) -> WorkerFailure:
        code = self.proc.wait(timeout=5) if self.proc is not None else None
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        self.conn = None
        return WorkerFailure("crash", f"the implementation's process {how}", self.stderr_tail())

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        timeout = self.timeout if timeout is None else timeout
        if self.conn is None:
            raise WorkerFailure("crash", "the worker is not running")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                self.conn = None
                raise WorkerFailure("timeout", f"no answer within {timeout:g} s: process killed", self.stderr_tail())
            try:
                ready = self.conn.poll(min(remaining, 0.5))
            except (OSError, EOFError):
                raise self._died() from None
            if ready:
                try:
                    raw = self.conn.recv_bytes()
                except (OSError, EOFError):
                    raise self._died() from None
                try:
                    msg = json.loads(raw.decode())
                except (UnicodeDecodeError, json.JSONDecodeError):
                    raise WorkerFailure("protocol", "the worker sent something that is not a JSON message") from None
                if not isinstance(msg, dict):
                    raise WorkerFailure("protocol", "the worker sent a JSON value that is not a message")
                return self._checked(msg)
            if self.proc is not None and self.proc.poll() is not None:
                raise self._died()

    def _checked(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("status") == "error":
            err = msg.get("error") or {}
            if err.get("phase") == "import" or msg.get("field") == "entry":
                where = f" ({err.get('where')})" if err.get("where") else ""
                raise ImplementationLoadError(
                    self.impl.path / "implementation.toml", "entry",
                    f"cannot load {self.impl.manifest.entry}: {err.get('type')}: {err.get('message')}{where}",
                )
            if msg.get("fatal"):
                self._kill()
                self.conn = None
            kind = "cuda-error" if msg.get("fatal") else "exception"
            text = f"{err.get('phase', 'call')} raised {err.get('type')}: {err.get('message')}"
            if err.get("where"):
                text += f" at {err['where']}"
            raise WorkerFailure(kind, text, self.stderr_tail() if msg.get("fatal") else "", err)
        return msg

    def request(self, timeout: float | None = None, **msg: Any) -> dict[str, Any]:
        self._send(msg)
        return self.receive(timeout)

    # -- operations -------------------------------------------------------------------------
    def bind(self, slot: str, tensors: dict[str, dict[str, Any]]) -> None:
        self.request(op="bind", slot=slot, tensors=tensors)

    def call(self, inputs: str, outputs: str | None, mode: str, poison: str | None = None,
             keep: str | None = None, after_forward=None) -> dict[str, Any]:
        """One call; `after_forward(loss_description)` runs in the parent between forward and backward."""
        self._send({"op": "call", "inputs": inputs, "outputs": outputs, "mode": mode, "poison": poison, "keep": keep})
        first = self.receive()
        if after_forward is not None:
            after_forward(first.get("loss"))
        self._send({"op": "continue"})
        return self.receive()["report"]
