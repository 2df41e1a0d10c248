"""The worker's stdout and stderr, capped: a pipe drained by a thread into a bounded in-memory buffer.

An implementation that prints in a loop must not fill a disk or /dev/shm (a file in the session's
directory grew without bound): only the last KEEP bytes are kept, the total is counted, and the
tail says how much came before it. Added by REPORT (issue 16) as the minimal cap; ISOLATION owns
the session.
"""

from __future__ import annotations

import os
import select
import threading
import time

KEEP = 64 << 10  # bytes of output kept; the failure evidence shows the last STDERR_TAIL of them


class OutputTail:
    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._r, self.write_fd = os.pipe()
        self._buf = bytearray()
        self.total = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name="worker-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        # Wait outside the lock, read and append inside it: a chunk is never held by this thread
        # alone, so "the pipe is empty" (under the lock) means "everything written is in the buffer".
        waiter = select.poll()  # poll, not select: a parent with many workers has descriptors past 1023
        waiter.register(self._r, select.POLLIN)
        try:
            while True:
                waiter.poll()
                with self._lock:
                    chunk = os.read(self._r, 1 << 16)
                    if not chunk:
                        break
                    self.total += len(chunk)
                    self._buf += chunk
                    if len(self._buf) > self.keep:
                        del self._buf[: len(self._buf) - self.keep]
        except (OSError, ValueError):
            pass
        finally:
            os.close(self._r)

    def started(self) -> None:
        """The child holds the write end now: close ours, so the pipe ends when the worker's tree does."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _drained(self) -> bool:
        """Called with the lock held. The first version checked the pipe without the lock: the drain
        thread could hold a chunk it had read but not yet appended, and the tail taken right after a
        worker's error reply missed its last line (clean-clone CI, stop 41)."""
        if not self._thread.is_alive():
            return True
        probe = select.poll()
        try:
            probe.register(self._r, select.POLLIN)
            return not probe.poll(0)
        except (OSError, ValueError):
            return True

    def _snapshot(self, n: int, limit_s: float = 0.5) -> tuple[bytes, int]:
        deadline = time.monotonic() + limit_s
        while True:
            with self._lock:
                if self._drained() or time.monotonic() >= deadline:
                    return bytes(self._buf[-n:]), self.total
            time.sleep(0.002)

    def tail(self, n: int) -> str:
        data, total = self._snapshot(n)
        text = data.decode("utf-8", errors="replace")
        if total > len(data):
            text = f"[... {total - len(data):,} earlier bytes of output not shown]\n" + text
        return text

    def close(self) -> None:
        self.started()
        self._thread.join(timeout=1.0)  # an escaped descendant may hold the pipe: never wait on it long
