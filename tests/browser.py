"""A page loaded in real headless Chromium over the DevTools protocol (--remote-debugging-pipe:
JSON messages ending in NUL, commands on fd 3, answers on fd 4), for tests of the static report.

`load_page(path)` returns what a reader's browser would have seen: every request the page made,
every failed load, every console error and uncaught exception, the result of a DOM query, and a
PNG screenshot of the whole page.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in CHROMIUM_NAMES) if p), None)


@dataclass
class PageLoad:
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dom: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int):
        self.w, self.r, self.buf, self.next_id = write_fd, read_fd, b"", 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method:
                return e
        while True:
            e = self._read(deadline)
            self.events.append(e)
            if e.get("method") == method:
                return e

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)


DOM_QUERY = """JSON.stringify({
  title: document.title,
  tables: document.querySelectorAll('table').length,
  timing_tables: document.querySelectorAll('table.timings').length,
  svgs: document.querySelectorAll('figure.plot svg').length,
  svg_text: Array.from(document.querySelectorAll('figure.plot svg text')).map(t => t.textContent).join(' '),
  body_width: document.body.scrollWidth, body_height: document.body.scrollHeight,
  ranked_first: Array.from(document.querySelectorAll('tr.first')).length
})"""


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    """The pipe's ends moved above fd 9, so that `3<&a 4>&b` in the child cannot overwrite one with the other."""
    import fcntl

    out = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return out  # type: ignore[return-value]


def load_page(chromium: str, page: Path, timeout: float = 60) -> PageLoad:
    profile = tempfile.mkdtemp(prefix="grpo-conform-chromium-")
    log = open(Path(profile) / "stderr.txt", "wb")  # Chromium's own complaints, quoted if it dies
    cmd_r, cmd_w = _high(os.pipe())  # we write commands, Chromium reads fd 3
    ans_r, ans_w = _high(os.pipe())  # Chromium writes answers on fd 4

    args = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
            "--no-default-browser-check", f"--user-data-dir={profile}", "--window-size=1300,900", "about:blank"]
    # bash puts the two pipe ends on fds 3 and 4 (dash takes no fd above 9; subprocess closes other fds
    # after any preexec_fn, so dup2 there would not survive).
    proc = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{cmd_r} 4>&{ans_w}', chromium, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                            pass_fds=(cmd_r, ans_w))
    os.close(cmd_r)
    os.close(ans_w)
    pipe = _Pipe(cmd_w, ans_r)
    out = PageLoad()
    try:
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        except (EOFError, TimeoutError) as exc:
            log.flush()
            tail = (Path(profile) / "stderr.txt").read_bytes()[-3000:].decode(errors="replace")
            raise RuntimeError(f"Chromium did not start: {exc}\n{tail}") from None
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout=timeout)
        dom = pipe.send("Runtime.evaluate", {"expression": DOM_QUERY, "returnByValue": True}, session=session)
        out.dom = json.loads(dom["result"]["value"])
        # The window only: the whole page (90,000 px tall with 366 records) took 9 of the test's 10.5 s as an
        # 18 MB PNG; the DOM query above already reads every table and plot of it.
        shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
                         session=session, timeout=timeout)
        out.screenshot = base64.b64decode(shot["data"])
        for e in pipe.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Network.requestWillBeSent":
                out.requests.append(p["request"]["url"])
            elif m == "Network.loadingFailed":
                out.failed.append(f"{p.get('errorText')} ({p.get('requestId')})")
            elif m == "Runtime.exceptionThrown":
                out.errors.append(p["exceptionDetails"].get("exception", {}).get("description")
                                  or p["exceptionDetails"].get("text", "exception"))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.errors.append(p["entry"]["text"])
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.errors.append(" ".join(str(a.get("value")) for a in p.get("args", [])))
        try:
            pipe.send("Browser.close", timeout=5)
        except (EOFError, TimeoutError, OSError):
            pass
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(cmd_w)
        os.close(ans_r)
        log.close()
        shutil.rmtree(profile, ignore_errors=True)
    return out
