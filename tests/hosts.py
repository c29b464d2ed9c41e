"""Hosts for multi-host tests: Linux network namespaces on one bridge, each with its own address,
hostname, /etc/hosts and /dev/shm; faults by nftables drops, ``tc tbf`` rate limits and SIGKILL.

The bridge lives in a namespace of its own and every address (10.77.0.0/24) exists only inside these
namespaces, with no default route: nothing touches the machine's own network. Names start with ``mh``
and the test process's id, so concurrent runs never share one. :meth:`Hosts.close` kills every
process in the namespaces and deletes them; it runs on every exit path (``with``, and ``atexit`` for
an interpreter that dies mid-test).

Needs root, iproute2, util-linux ``unshare``, nftables (partitions) and tc (slow links); :func:`why_not`
says what is missing, for a test's skip reason.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

SUBNET = "10.77.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def why_not() -> str:
    """Why namespaced hosts cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "network-namespace hosts need root"
    for tool in ("ip", "unshare", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"network-namespace hosts need {tool} (iproute2, util-linux, nftables)"
    probe = f"mh{os.getpid()}probe"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"`ip netns add` fails here: {getattr(exc, 'stderr', '') or exc}".strip()
    _ip("netns", "del", probe, check=False)
    return ""


class Hosts:
    """``names`` as hosts on one bridge; ``addr(name)`` is each one's address."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.tag = f"mh{os.getpid()}"
        self.bridge_ns = f"{self.tag}br"
        self.ns = {n: f"{self.tag}{n}" for n in self.names}
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-hosts-"))
        self.procs: list[subprocess.Popen] = []
        self.made: list[str] = []
        self._closed = False
        atexit.register(self.close)

    def addr(self, name: str) -> str:
        return f"{SUBNET}.{self.names.index(name) + 1}"

    def __enter__(self) -> Hosts:
        try:
            self.up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- set-up ------------------------------------------------------------------------------------

    def up(self) -> None:
        _ip("netns", "add", self.bridge_ns)
        self.made.append(self.bridge_ns)
        self._in(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.bridge_ns, "ip", "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.addr(n)} {n}\n" for n in self.names)
        (self.dir / "hosts").write_text(hosts)
        for i, name in enumerate(self.names):
            ns = self.ns[name]
            _ip("netns", "add", ns)
            self.made.append(ns)
            inner, outer = f"{self.tag}i{i}"[:15], f"{self.tag}o{i}"[:15]
            _ip(
                "link",
                "add",
                inner,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                outer,
                "netns",
                self.bridge_ns,
            )
            self._in(ns, "ip", "link", "set", inner, "name", "eth0")
            self._in(ns, "ip", "addr", "add", f"{self.addr(name)}/24", "dev", "eth0")
            self._in(ns, "ip", "link", "set", "eth0", "up")
            self._in(ns, "ip", "link", "set", "lo", "up")
            self._in(self.bridge_ns, "ip", "link", "set", outer, "master", "br0")
            self._in(self.bridge_ns, "ip", "link", "set", outer, "up")
            self._outer = getattr(self, "_outer", {})
            self._outer[name] = outer

    def _in(self, ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=check, timeout=30
        )

    # --- processes ---------------------------------------------------------------------------------

    def popen(self, name: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """``argv`` on host ``name``: its namespace, hostname, /etc/hosts and a /dev/shm of its own."""
        shell = (
            f"hostname {name} && mount --bind {self.dir / 'hosts'} /etc/hosts && "
            f'mount -t tmpfs -o size=512m,mode=1777 shm-{self.tag}{name} /dev/shm && exec "$@"'
        )
        cmd = ["ip", "netns", "exec", self.ns[name], "unshare", "--uts", "--mount", "--", "sh", "-c", shell]
        p = subprocess.Popen([*cmd, "sh", *argv], start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def pids(self, name: str) -> list[int]:
        out = _ip("netns", "pids", self.ns[name], check=False).stdout
        return [int(x) for x in out.split()]

    # --- faults ------------------------------------------------------------------------------------

    def partition(self, name: str) -> None:
        """Drop every packet in and out of ``name`` but its loopback (no reset: a silent cut)."""
        rules = (
            "table inet mhcut {\n"
            " chain in { type filter hook input priority -10; policy drop; iif lo accept; }\n"
            " chain out { type filter hook output priority -10; policy drop; oif lo accept; }\n}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", self.ns[name], "nft", "-f", "-"],
            input=rules,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )

    def heal(self, name: str) -> None:
        self._in(self.ns[name], "nft", "delete", "table", "inet", "mhcut")

    def slow(self, name: str, rate: str = "1mbit") -> None:
        """Limit ``name``'s link both ways (its side and the bridge's port) to ``rate``."""
        tbf = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        self._in(self.ns[name], "tc", "qdisc", "add", "dev", "eth0", "root", *tbf)
        self._in(self.bridge_ns, "tc", "qdisc", "add", "dev", self._outer[name], "root", *tbf)

    def unslow(self, name: str) -> None:
        """Lift :meth:`slow`'s rate limits from ``name``'s link."""
        self._in(self.ns[name], "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        self._in(self.bridge_ns, "tc", "qdisc", "del", "dev", self._outer[name], "root", check=False)

    def kill(self, name: str) -> None:
        """SIGKILL every process of host ``name`` (a host lost loudly: its peers see resets)."""
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def vanish(self, name: str) -> None:
        """Host ``name`` drops off the network, then dies: its peers never see a reset."""
        self.partition(name)
        self.kill(name)

    # --- clean-up ----------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in self.names:
            if self.ns[name] in self.made:
                self.kill(name)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)
