"""A real Slurm cluster on this machine: munged, slurmctld and four slurmd (-N node1..node4).

Everything lives in a temporary directory (SLURM_CONF points there; /etc is not touched); munged
gets its own socket so it never collides with a system munged. Daemons are stopped at teardown.
Skipped, with the reason, only when the Slurm/munge binaries are not installed (.ci/run installs them).
Importable from every test package, as ``netutil``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from netutil import free_ports

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "srun")
NODES = ("node1", "node2", "node3", "node4")


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{self.logs()}")
        return proc

    def nodes(self) -> dict[str, tuple[str, str]]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E").stdout
        res = {}
        for line in out.splitlines():
            name, state, reason = line.split("|", 2)
            res[name] = (state, "" if reason == "none" else reason)
        return res

    def wait_for(self, pred, timeout: float = 30.0, what: str = "condition") -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if pred(self.nodes()):
                return time.monotonic() - t0
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {self.nodes()}\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for p in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)


def _conf(root: Path, ctld_port: int, node_ports: list[int], munge_socket: Path, extra: str) -> str:
    nodes = "\n".join(
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=2 RealMemory=1000 "
        "State=UNKNOWN"
        for n, p in zip(NODES, node_ports, strict=True)
    )
    return f"""ClusterName=stalwarttest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
SlurmctldPort={ctld_port}
StateSaveLocation={root}/spool/ctld
SlurmdSpoolDir={root}/spool/d-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
ReturnToService=1
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
{extra}
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in reversed(procs):
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(2)


def start_cluster(root: Path, extra_conf: str = "") -> SlurmCluster:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm binaries not installed ({', '.join(missing)}): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (slurmd/slurmctld run as root here)")
    for d in ("spool/ctld", "log", "munge"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o700)
    munge_socket = root / "munge" / "munge.sock"
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    os.chmod(key, 0o600)
    ports = free_ports(5)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, ports[0], ports[1:], munge_socket, extra_conf))
    env = dict(os.environ, SLURM_CONF=str(conf))
    cluster = SlurmCluster(root, conf, env)
    try:
        cluster.procs.append(
            subprocess.Popen(
                [
                    "munged",
                    "-F",
                    "--force",
                    f"--socket={munge_socket}",
                    f"--key-file={key}",
                    f"--pid-file={root / 'munge' / 'munged.pid'}",
                    f"--log-file={root / 'log' / 'munged.log'}",
                    f"--seed-file={root / 'munge' / 'seed'}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        t0 = time.monotonic()
        while not munge_socket.exists():
            if time.monotonic() - t0 > 10:
                raise AssertionError("munged did not create its socket\n" + cluster.logs())
            time.sleep(0.02)
        cluster.procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-c", "-f", str(conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        for n in NODES:
            cluster.procs.append(
                subprocess.Popen(
                    ["slurmd", "-D", "-N", n, "-f", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        t0 = time.monotonic()
        while True:
            try:
                nodes = cluster.nodes()
                if len(nodes) == 4 and all(s[0] in ("idle", "drained") for s in nodes.values()):
                    break
            except (AssertionError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() - t0 > 30:
                raise AssertionError("Slurm nodes did not come up\n" + cluster.logs())
            time.sleep(0.1)
    except BaseException:
        _stop(cluster.procs)
        raise
    return cluster


@pytest.fixture
def slurm_factory(tmp_path_factory):
    started: list[SlurmCluster] = []

    def make(extra_conf: str = "") -> SlurmCluster:
        c = start_cluster(tmp_path_factory.mktemp("slurm"), extra_conf)
        started.append(c)
        return c

    yield make
    for c in started:
        _stop(c.procs)
