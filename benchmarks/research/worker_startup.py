"""What each worker namespace costs at start-up (issue 28's closing note; docs/checks.md).

    sudo PYTHONPATH=$PWD python3 benchmarks/research/worker_startup.py [--repeat 10]

Starts a worker for a trivial implementation (`load` answered, then closed) `--repeat` times per
variant and prints the median and spread of `WorkerSession.start()` (fork, launcher, namespaces,
privilege drop, exec of the interpreter, torch's import, the load reply) and of `close()` (kill,
reap, the fallback sweep, removing the scratch tree). Variants: no namespace (the fallback sweep
does the clean-up), IPC namespace only, private mounts only, both (the default as root on the CPU).
A first table times the system calls alone, in a forked child (unshare(CLONE_NEWIPC); unshare
(CLONE_NEWNS) with the private tmpfs mounts), 50 times each. A second table times the launcher
alone (`python -m grpo_conform.isolation.launch PLAN` executing /bin/true after its namespaces
and the uid change), where torch's import does not drown the cost.
Needs root (the namespaces and the uid change); the variants are interleaved so that a machine
getting busier affects them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_conform.implementations import load_implementation
from grpo_conform.isolation import namespaces, privilege
from grpo_conform.isolation.session import WorkerSession

VARIANTS = {"none": (False, False), "ipc": (True, False), "mounts": (False, True), "ipc+mounts": (True, True)}
MANIFEST = ('name = "trivial"\nspec = "grpo-token-is"\nentry = "impl:grpo_loss"\nlanguage = "python"\n'
            'license = "MIT"\ndevices = ["cpu"]\ndescription = "start-up timing"\n')


def _in_child(fn) -> float:
    """Seconds `fn` took in a forked child (namespaces are per process: the parent stays as it was)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        t0 = time.perf_counter()
        fn()
        os.write(w, repr(time.perf_counter() - t0).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        took = float(f.read())
    os.waitpid(pid, 0)
    return took


def syscall_costs(repeat: int = 50) -> None:
    from grpo_conform.isolation import launch

    scratch = Path(tempfile.mkdtemp())
    os.chmod(scratch, 0o711)
    private = privilege.private_scratch_mounts(scratch, "cpu")

    def mounts():
        stage = tempfile.mkdtemp(dir=scratch)
        launch.apply_mounts([], stage, private, {})

    for name, fn in (("unshare(CLONE_NEWIPC)", lambda: launch.enter_ipc_namespace({})),
                     (f"mount ns + {len(private)} private tmpfs", mounts)):
        took = sorted(_in_child(fn) for _ in range(repeat))
        print(f"{name:<32} median {statistics.median(took) * 1e3:7.3f} ms  max {took[-1] * 1e3:7.3f} ms  (n={repeat})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    if os.getuid() != 0:
        sys.exit("run as root: the namespaces and the uid change need it")
    syscall_costs()
    folder = Path(tempfile.mkdtemp()) / "trivial"
    folder.mkdir()
    (folder / "implementation.toml").write_text(MANIFEST)
    (folder / "impl.py").write_text("def grpo_loss(*args, **kwargs):\n    raise NotImplementedError\n")
    impl = load_implementation(folder)
    starts: dict[str, list[float]] = {v: [] for v in VARIANTS}
    closes: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):
        for name, (ipc, mounts) in VARIANTS.items():
            namespaces.wanted = lambda device, sandboxed, ipc=ipc, mounts=mounts: {  # noqa: E731
                "ipc": ipc, "mounts": mounts, "proc": mounts}
            session = WorkerSession(impl, {}, torch.device("cpu"), 60.0)
            t0 = time.perf_counter()
            session.start()
            t1 = time.perf_counter()
            assert session.info["isolation"]["ipc_namespace"] is ipc
            session.close()
            t2 = time.perf_counter()
            starts[name].append(t1 - t0)
            closes[name].append(t2 - t1)
    launcher: dict[str, list[float]] = {v: [] for v in VARIANTS}
    scratch = Path(tempfile.mkdtemp())
    os.chmod(scratch, 0o711)
    for k in range(args.repeat):
        for name, (ipc, mounts) in VARIANTS.items():
            stage = scratch / f"stage-{name}-{k}"
            stage.mkdir(mode=0o700)
            plan = {"uid": 589999, "gid": 589999, "cwd": "/", "argv": ["/bin/true"], "env": {}, "mounts": [],
                    "stage": str(stage), "ipc": ipc,
                    "private": privilege.private_scratch_mounts(scratch, "cpu") if mounts else []}
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "grpo_conform.isolation.launch", json.dumps(plan)], check=True)
            launcher[name].append(time.perf_counter() - t0)
    print(f"{'variant':<12}{'launcher median s':>18}{'min':>8}{'max':>8}   (launcher + /bin/true, n={args.repeat})")
    for name in VARIANTS:
        s = launcher[name]
        print(f"{name:<12}{statistics.median(s):>18.4f}{min(s):>8.4f}{max(s):>8.4f}")
    print(f"{'variant':<12}{'start median s':>16}{'min':>8}{'max':>8}{'close median s':>16}   (n={args.repeat})")
    for name in VARIANTS:
        s, c = starts[name], closes[name]
        print(f"{name:<12}{statistics.median(s):>16.3f}{min(s):>8.3f}{max(s):>8.3f}{statistics.median(c):>16.3f}")


if __name__ == "__main__":
    main()
