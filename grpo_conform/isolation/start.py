"""The object the parent pickles to start a worker (session.py) through multiprocessing's spawn
bootstrap: a module of its own, importing nothing at the top, so unpickling it is light."""

from __future__ import annotations

#: The argv of every worker (and of the zygote its forked workers come from, zygote.py): that of any
#: multiprocessing spawn child.
SPAWN_ARGV = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd={tracker}, pipe_handle={pipe})"


class Start:
    """What the multiprocessing spawn bootstrap unpickles in the worker (defined in this light
    module, so unpickling imports nothing heavy): its `_bootstrap` runs the worker
    (grpo_conform.isolation.worker.run) on the message socket."""

    def __init__(self, fd: int, malloc: bool):
        self.fd, self.malloc = fd, malloc

    def _bootstrap(self, parent_sentinel: int | None = None) -> int:
        # imported here, not above: unpickling a Start (the spawn bootstrap) must import nothing heavy
        from grpo_conform.isolation.worker import run

        run(self.fd, self.malloc)
        return 0

