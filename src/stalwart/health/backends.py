"""Where drains and resumes go: a small protocol, a local (ledger-only) backend and Slurm.

A Kubernetes backend (cordon + taint) would implement the same four methods.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from typing_extensions import assert_never

from ..errors import ConfigError, SchedulerError
from ..node_name import validate_drain_reason, validate_node_name
from ..policy.label import Label
from .deadline import CallTimedOut, run_command
from .lifecycle import SchedulerView
from .slurm_failure import NO_CONFIG_HINT, missing_slurm_conf, slurm_failure


@dataclass(frozen=True)
class NodeStatus:
    node: str
    state: str
    reason: str = ""


class NodeBackend(Protocol):
    name: str

    def view(self, node: str) -> SchedulerView | None: ...

    def drain(self, node: str, reason: str) -> str: ...

    def resume(self, node: str) -> str: ...

    def list_nodes(self) -> list[NodeStatus]: ...


class LocalBackend:
    """No scheduler: the ledger is the only record of a drain (the agent excludes quarantined nodes)."""

    name = "local"

    def view(self, node: str) -> SchedulerView | None:
        return None

    def drain(self, node: str, reason: str) -> str:
        return "quarantined (ledger only)"

    def resume(self, node: str) -> str:
        return "admitted (ledger only)"

    def list_nodes(self) -> list[NodeStatus]:
        return []


def _is_drained(state: str) -> bool:
    s = state.lower()
    return "drain" in s or s.startswith("down") or s.startswith("fail")


class SlurmBackend:
    """``scontrol update`` to drain/resume, ``sinfo`` to read back; every call under a timeout."""

    name = "slurm"

    def __init__(self, *, timeout_s: float = 10.0, scontrol: str = "scontrol", sinfo: str = "sinfo") -> None:
        self.timeout_s = timeout_s
        self.scontrol = scontrol
        self.sinfo = sinfo

    def _run(self, argv: list[str]) -> str:
        missing = missing_slurm_conf(os.environ)
        if missing:  # Slurm's tools would retry reading that file for 60 s before they fail
            raise SchedulerError(f"no Slurm configuration found: {missing}", NO_CONFIG_HINT)
        try:
            proc = run_command(argv, self.timeout_s)
        except CallTimedOut as exc:
            raise SchedulerError(
                f"{argv[0]} did not answer within {self.timeout_s:g} s",
                "is slurmctld running ('scontrol ping'), and does SLURM_CONF name this cluster's slurm.conf?",
            ) from exc
        except OSError as exc:
            raise SchedulerError(f"cannot run {argv[0]}: {exc}", "install the Slurm client tools") from exc
        if proc.returncode != 0:
            raise slurm_failure(argv, proc.returncode, proc.stderr or proc.stdout)
        return proc.stdout

    def list_nodes(self) -> list[NodeStatus]:
        out = self._run([self.sinfo, "-h", "-N", "-o", "%N|%T|%E"])
        seen: dict[str, NodeStatus] = {}
        for line in out.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3 and parts[0] not in seen:  # a node in two partitions is listed twice
                reason = "" if parts[2].strip() == "none" else parts[2].strip()
                seen[parts[0]] = NodeStatus(parts[0], parts[1].strip(), reason)
        return list(seen.values())

    def status(self, node: str) -> NodeStatus:
        validate_node_name(node)
        out = self._run([self.sinfo, "-h", "-N", "-n", node, "-o", "%N|%T|%E"])
        for line in out.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3 and parts[0] == node:
                reason = "" if parts[2].strip() == "none" else parts[2].strip()
                return NodeStatus(node, parts[1].strip(), reason)
        raise SchedulerError(f"Slurm does not know node {node!r}", "check the name with 'sinfo -N'")

    def view(self, node: str) -> SchedulerView:
        st = self.status(node)
        return SchedulerView(drained=_is_drained(st.state), reason=st.reason, state=st.state)

    def drain(self, node: str, reason: str) -> str:
        validate_node_name(node)
        if not reason.strip():
            raise SchedulerError("Slurm needs a reason to drain a node")
        validate_drain_reason(reason)
        self._run([self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return self.status(node).state

    def resume(self, node: str) -> str:
        validate_node_name(node)
        self._run([self.scontrol, "update", f"NodeName={node}", "State=RESUME"])
        return self.status(node).state


class BackendKind(Label):
    """Where drains and resumes go (the ``--backend`` value)."""

    LOCAL = "local"
    SLURM = "slurm"


def make_backend(name: str) -> NodeBackend:

    try:
        kind = BackendKind(name)
    except ValueError:
        raise ConfigError(f"unknown backend {name!r}", "use 'local' or 'slurm'") from None
    match kind:
        case BackendKind.LOCAL:
            return LocalBackend()
        case BackendKind.SLURM:
            return SlurmBackend()
        case _:
            assert_never(kind)
