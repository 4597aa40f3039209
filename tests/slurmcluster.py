"""A real one-node Slurm on loopback, started and stopped by a test (needs root: slurmd runs jobs
as their users).

munged with a key of its own and its socket in a temporary folder, then slurmctld and slurmd
(Debian's ``slurmctld slurmd slurm-client munge``) in the foreground with a ``slurm.conf``
generated there: ports of their own on 127.0.0.1, state and spool folders in the temporary
folder, no accounting database, no cgroups (``proctrack/linuxproc``, ``task/none``), one node
``localhost`` with this machine's CPUs and memory, and two partitions (``debug``, the default,
and ``lab``). Clients find it through ``SLURM_CONF`` (:meth:`SlurmCluster.env`).

Stopping cancels the cluster's jobs, then ends exactly what it started: the three daemons by
pid, and the job step daemons (``slurmstepd``) and job processes that carry this cluster's
``SLURM_CONF`` in their environment (another Slurm of the machine is never touched).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tests.clusters import end_processes
from tests.ports import free_port

#: The programs the cluster needs, and the Debian packages that ship them.
PROGRAMS = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "sinfo": "slurm-client",
}
START_TIMEOUT_S = 60.0


def missing() -> str | None:
    """Why no Slurm can start here (a reason for ``pytest.skip``), or None."""
    if os.geteuid() != 0:
        return "needs root: slurmd runs each job as its user (CI's root pass runs it)"
    absent = sorted({pkg for prog, pkg in PROGRAMS.items() if _which(prog) is None})
    if absent:
        return f"no Slurm here: apt-get install {' '.join(absent)} (as .ci/run does)"
    return None


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


@dataclass
class SlurmCluster:
    folder: Path
    conf: Path
    run: Path  # munged's socket and the daemons' pid files
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands reach this cluster."""
        return {**(base if base is not None else os.environ), "SLURM_CONF": str(self.conf)}

    def command(self, *argv: str, check: bool = True) -> str:
        """A Slurm client command (``sinfo``, ``squeue``, ``scontrol``, ``scancel``) against this
        cluster; its standard output."""
        done = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` of one job as KEY: VALUE."""
        text = self.command("scontrol", "show", "job", "--oneliner", job_id)
        return dict(word.split("=", 1) for word in text.split() if "=" in word)

    def node_state(self) -> str:
        """The node's state in ``sinfo`` (one line per partition, each the same)."""
        return " ".join(
            sorted(set(self.command("sinfo", "--noheader", "--Node", "--nodes=localhost", "--format=%T").split()))
        )

    def logs(self) -> str:
        """The daemons' logs, for an assertion's message."""
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in sorted(self.folder.glob("log/*"))
        )

    def _job_processes(self) -> list[psutil.Process]:
        """slurmstepd and job processes of this cluster: those with its SLURM_CONF."""
        mine: list[psutil.Process] = []
        started = {p.pid for p in self.procs}
        for proc in psutil.process_iter():
            if proc.pid in started:
                continue
            try:
                if proc.environ().get("SLURM_CONF") == str(self.conf):
                    mine.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return mine

    def stop(self) -> None:
        try:
            self.command("scancel", "--full", "--user=root", check=False)
        except (OSError, subprocess.SubprocessError):
            pass
        deadline = time.time() + 5  # the jobs end on their own; what lingers (a node broker) is ended
        while time.time() < deadline and self._job_processes():
            time.sleep(0.5)
        end_processes(self._job_processes())
        end_processes([psutil.Process(p.pid) for p in reversed(self.procs) if p.poll() is None])
        for proc in self.procs:
            proc.wait(timeout=30)
        shutil.rmtree(self.run, ignore_errors=True)


def slurm_conf(folder: Path, run: Path, *, cpus: int, memory_mb: int) -> str:
    """The one-node cluster's ``slurm.conf``: state and logs in ``folder``, sockets and pid files
    in ``run``, ports of its own."""
    return f"""\
ClusterName=harnesstest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={run}/munge.sock
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=lab Nodes=localhost MaxTime=INFINITE State=UP
"""


def start_slurm(root: Path) -> SlurmCluster:
    """munged, slurmctld and slurmd under ``root/slurm``, waited on until the node is idle."""
    folder = root / "slurm"
    for name in ("key", "state", "spool", "log"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    # munged's socket: in a folder of its own under the system's temporary folder, since munged
    # refuses a socket whose folders not everyone may enter (pytest's are the user's alone), and
    # a socket's path has at most 107 bytes.
    run = Path(tempfile.mkdtemp(prefix="harness-slurm-"))
    run.chmod(0o755)
    key = folder / "key" / "munge.key"
    subprocess.run([_which("mungekey") or "mungekey", "--create", f"--keyfile={key}"], check=True, timeout=60)
    memory_mb = psutil.virtual_memory().total // 2**20 - 1024
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, run, cpus=os.cpu_count() or 1, memory_mb=memory_mb))
    cluster = SlurmCluster(folder, conf, run)
    env = cluster.env()
    log = folder / "log"
    try:
        cluster.procs.append(
            _daemon(
                [
                    "munged",
                    "--foreground",
                    f"--socket={run}/munge.sock",
                    f"--key-file={key}",
                    f"--pid-file={run}/munged.pid",
                    f"--seed-file={folder}/key/munged.seed",
                    f"--log-file={log}/munged.log",
                ],
                env,
                log / "munged.out",
            )
        )
        _wait_for(lambda: (run / "munge.sock").exists(), "munged's socket", cluster)
        cluster.procs.append(_daemon(["slurmctld", "-D", "-i", "-f", str(conf)], env, log / "slurmctld.out"))
        cluster.procs.append(_daemon(["slurmd", "-D", "-N", "localhost", "-f", str(conf)], env, log / "slurmd.out"))
        _wait_for(lambda: cluster.node_state() == "idle", "the node idle in sinfo", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _daemon(argv: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as sink:
        return subprocess.Popen(
            [_which(argv[0]) or argv[0], *argv[1:]],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(check: Callable[[], bool], what: str, cluster: SlurmCluster) -> None:
    deadline = time.time() + START_TIMEOUT_S
    while True:
        try:
            if check():
                return
        except (AssertionError, OSError, subprocess.SubprocessError):
            pass
        if time.time() > deadline:
            raise AssertionError(f"Slurm did not start: timed out waiting for {what}\n{cluster.logs()}")
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise AssertionError(f"Slurm did not start: {proc.args[0]} exited {proc.returncode}\n{cluster.logs()}")
        time.sleep(0.3)
