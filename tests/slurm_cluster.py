"""A throwaway Slurm cluster on this machine for tests: munged with a fresh key, slurmctld and one
slurmd (two CPUs, two stand-in GPUs) on 127.0.0.1, every file (config, state, spool, sockets, logs)
in one temporary folder and free ports, so it runs beside other tests and never touches /etc/slurm.

Every daemon is started with GC_SLURM_CLUSTER=<folder> in its environment, which the jobs and their
slurmstepd inherit: `stop` kills exactly the processes carrying this marker, also when the test
failed half way. Waits are bounded; a cluster that does not come up raises `SlurmUnavailable`
with the reason and the daemons' last log lines."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
MARKER = "GC_SLURM_CLUSTER"


class SlurmUnavailable(Exception):
    """Slurm or munge is missing or would not start here; the message says which and why."""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait(what: str, ready, timeout: float, cluster: "SlurmCluster") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return
        dead = [name for name, p in cluster.procs.items() if p.poll() is not None]
        if dead:
            break
        time.sleep(0.2)
    raise SlurmUnavailable(f"{what} not ready within {timeout:.0f} s\n{cluster.log_tail()}")


CONF = """\
ClusterName=gctest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MinJobAge=600
GresTypes=gpu
NodeName=gcnode NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:2 State=UNKNOWN
PartitionName=gc Nodes=gcnode Default=YES MaxTime=INFINITE State=UP
"""
# Stand-in GPUs: gres/gpu needs a device file per GPU; Slurm only counts them and sets
# CUDA_VISIBLE_DEVICES, so a recipe's `--gres=gpu:1` is scheduled as on a GPU cluster.
GRES = "NodeName=gcnode Name=gpu File=/dev/null\nNodeName=gcnode Name=gpu File=/dev/zero\n"


class SlurmCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gcslurm-", dir="/tmp"))  # short: socket paths
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.dir / "slurm.conf"), **{MARKER: str(self.dir)})
        # the daemons live in /usr/sbin, which a non-root CI user's PATH may lack
        self.env["PATH"] = os.pathsep.join([self.env.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
        for k in [k for k in self.env if k.startswith(("SBATCH_", "SLURM_")) and k != "SLURM_CONF"]:
            del self.env[k]  # a test run inside a Slurm job must not leak its job's settings

    def start(self) -> "SlurmCluster":
        missing = [exe for exe in DAEMONS if shutil.which(exe, path=self.env["PATH"]) is None]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} not found (apt-get install slurm-wlm munge: "
                                   ".ci/run does)")
        d = self.dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        run = subprocess.run(["mungekey", "-c", "-k", str(d / "munge.key")], env=self.env, capture_output=True,
                             text=True)
        if run.returncode:
            raise SlurmUnavailable(f"mungekey failed: {run.stderr.strip()}")
        self._spawn("munged", ["munged", "-F", "-f", f"--key-file={d}/munge.key", f"--socket={d}/munge.sock",
                               f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"])
        _wait("munged", lambda: (d / "munge.sock").exists(), 10, self)
        ctld, slurmd = _free_ports(2)
        (d / "slurm.conf").write_text(CONF.format(host=socket.gethostname(), ctld_port=ctld, slurmd_port=slurmd,
                                                  user=getpass.getuser(), d=d))
        (d / "gres.conf").write_text(GRES)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(d / "slurm.conf")])
        _wait("slurmctld", lambda: self.ok("scontrol", "ping") and "UP" in self.out("scontrol", "ping"), 20, self)
        self._spawn("slurmd", ["slurmd", "-D", "-N", "gcnode", "-f", str(d / "slurm.conf")])
        _wait("slurmd (node gcnode idle)", lambda: self.out("sinfo", "-h", "-n", "gcnode", "-o", "%t") == "idle",
              30, self)
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def out(self, *argv: str, timeout: float = 15) -> str:
        run = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        return run.stdout.strip()

    def ok(self, *argv: str) -> bool:
        return subprocess.run(argv, env=self.env, capture_output=True, timeout=15).returncode == 0

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (one per array task: the first)."""
        line = self.out("scontrol", "-o", "show", "job", job_id).splitlines()
        return dict(kv.split("=", 1) for kv in line[0].split() if "=" in kv) if line else {}

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.out("squeue", "-h"):
                return True
            time.sleep(0.5)
        return False

    def log_tail(self, lines: int = 8) -> str:
        out = []
        for name in ("munged.out", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            p = self.dir / name
            if p.exists():
                tail = p.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def leftovers(self) -> list[int]:
        """Processes started by this cluster: their environment carries its marker."""
        mark = f"{MARKER}={self.dir}".encode()
        pids = []
        for env in Path("/proc").glob("[0-9]*/environ"):
            try:
                if mark in env.read_bytes().split(b"\0"):
                    pids.append(int(env.parent.name))
            except (OSError, ValueError):
                continue
        return [p for p in pids if p != os.getpid()]

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                subprocess.run(["scancel", "--user", getpass.getuser()], env=self.env, capture_output=True, timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        for pid in self.leftovers():  # job steps and scripts slurmd left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
