"""The parent orders the worker's reads after its own CUDA writes: a device synchronize before every
message it sends (2026-12-01 on the H200: without it, input-layouts failed Triton at seed-b16 because
the worker read views the parent was still writing)."""

from __future__ import annotations

import torch

from grpo_conform.isolation.session import WorkerSession


class _Conn:
    def __init__(self, log):
        self.log = log

    def send_bytes(self, data):
        self.log.append(("send", data))


def _session(device: str, log: list) -> WorkerSession:
    s = object.__new__(WorkerSession)  # no worker: only the send path is under test
    s.conn, s.device, s._sock = _Conn(log), torch.device(device), None
    return s


def test_cuda_session_synchronizes_before_each_message(monkeypatch):
    log: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", str(device))))
    s = _session("cuda", log)
    s._send({"op": "forward"})
    s._send({"op": "backward"})
    assert [k for k, _ in log] == ["sync", "send", "sync", "send"]


def test_cpu_session_sends_without_a_device_synchronize(monkeypatch):
    log: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", device)))
    _session("cpu", log)._send({"op": "forward"})
    assert [k for k, _ in log] == ["send"]
