"""Device feasibility probe for worker isolation (issue 11): can a worker that runs as another
uid, or in its own PID namespace, still open the parent's CUDA tensors through CUDA IPC? And
can it reach the parent (/proc/<ppid>/mem, signals)?

Run as root on the GPU machine: python3 benchmarks/isolation_probe.py
Prints one line per wrapper: whether the IPC open worked, the values it saw, whether its write
reached the parent, and whether it could read the parent's memory or signal it.
"""
import base64
import os
import pickle
import subprocess
import sys

import torch
import torch.multiprocessing  # noqa: F401  (CUDA IPC reductions)

CHILD = r'''
import base64, os, pickle, sys, json
out = {"uid": os.getuid()}
ppid = int(os.environ["PROBE_PARENT"])
try:
    with open(f"/proc/{ppid}/mem", "rb") as f:
        out["parent_mem"] = "readable"
except OSError as e:
    out["parent_mem"] = type(e).__name__
try:
    os.kill(ppid, 0)
    out["signal_parent"] = "allowed"
except OSError as e:
    out["signal_parent"] = type(e).__name__
try:
    import torch, torch.multiprocessing
    t = pickle.loads(base64.b64decode(sys.stdin.read()))
    out["sum"] = float(t.float().sum())
    t.add_(1)
    torch.cuda.synchronize()
    out["ipc"] = "ok"
except Exception as e:
    out["ipc"] = f"{type(e).__name__}: {str(e)[:200]}"
print(json.dumps(out))
'''

NOCAPS = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
WRAPPERS = {
    "plain": [],
    "root-nocaps": NOCAPS,
    "setpriv-nobody": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs", "--"],
    "root-nocaps-ipc": NOCAPS,
    "pidns": ["unshare", "-p", "-f", "--kill-child", "--"],
    "pidns+setpriv": ["unshare", "-p", "-f", "--kill-child", "--", "setpriv", "--reuid=65534", "--regid=65534",
                      "--clear-groups", "--no-new-privs", "--"],
    "pidns+mountproc+setpriv": ["unshare", "-p", "-f", "-m", "--mount-proc", "--kill-child", "--", "setpriv",
                                "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs", "--"],
}


REVERSE = r'''
import base64, sys, time, torch, torch.multiprocessing
from multiprocessing.reduction import ForkingPickler
t = torch.arange(1024, dtype=torch.float32, device="cuda")
print(base64.b64encode(bytes(ForkingPickler.dumps(t))).decode(), flush=True)
sys.stdin.readline()  # the parent has mapped it
torch.cuda.synchronize()
print(float(t.sum()), flush=True)
mode = sys.stdin.readline().strip()
if mode == "free":
    del t
    torch.cuda.empty_cache()
print("freed", flush=True)
sys.stdin.readline()
'''


def reverse(name, wrap, mode):
    """The worker allocates and exports; the parent (root) imports, writes, then the worker may free."""
    p = subprocess.Popen(wrap + [sys.executable, "-c", REVERSE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd="/tmp", env=dict(os.environ, HOME="/tmp"))
    try:
        t = pickle.loads(base64.b64decode(p.stdout.readline()))
        t.add_(1)
        torch.cuda.synchronize()
        p.stdin.write("\n"); p.stdin.flush()
        seen = p.stdout.readline().strip()
        p.stdin.write(mode + "\n"); p.stdin.flush()
        p.stdout.readline()
        after = float(t.sum())
        torch.cuda.synchronize()
        print(f"reverse {name:20s} {mode:5s} worker saw {seen} parent reads after free {after:.0f}: ok")
    except Exception as e:
        print(f"reverse {name:20s} {mode:5s} failed: {type(e).__name__}: {str(e)[:200]} {p.stderr.read()[-300:]!r}")
    finally:
        p.kill()


def nondumpable_parent() -> None:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0


def main() -> None:
    from multiprocessing.reduction import ForkingPickler

    for name, wrap in [("nobody", WRAPPERS["setpriv-nobody"]), ("root-nocaps", NOCAPS)]:
        for mode in ("keep", "free"):
            reverse(name, wrap, mode)
    if "--nondumpable" not in sys.argv:
        nondumpable_parent()
        print("parent is now non-dumpable")
    for name, wrap in WRAPPERS.items():
        t = torch.arange(1024, dtype=torch.float32, device="cuda")
        blob = base64.b64encode(bytes(ForkingPickler.dumps(t))).decode()
        env = dict(os.environ, PROBE_PARENT=str(os.getpid()), HOME="/tmp")
        try:
            p = subprocess.run(wrap + [sys.executable, "-c", CHILD], input=blob, capture_output=True, text=True,
                               env=env, timeout=120, cwd="/tmp")
            torch.cuda.synchronize()
            seen = float(t.sum())
            print(f"{name:28s} rc={p.returncode} child={p.stdout.strip()[:300]} parent_sum_after={seen:.0f} "
                  f"stderr={p.stderr.strip()[-300:]!r}")
        except Exception as e:
            print(f"{name:28s} probe failed: {e}")


if __name__ == "__main__":
    main()
