"""The one vocabulary: every word Stalwart uses to say what failed, what broke, who owns the fix, how
a job recovered and what state a node is in. Defined here once; the ledger, console, report,
``/metrics`` labels, alerts, dashboard and docs all print these values and nothing else
(``tests/unit/test_vocabulary_surfaces.py`` fails when a surface prints a word outside them).

- :class:`FailureKind`: what the agent saw fail (a ledger ``FailureDetected.failure``; the
  ``cause`` label of ``stalwart_restarts_total`` and ``stalwart_interruptions_total``).
- :class:`Component`: what broke (an incident's component; an interruption's class in the report
  and the ``class`` label of ``stalwart_incidents_total``), told from the evidence.
- :class:`FaultClass`: who owns the fix (an incident's class).
- :class:`RecoveryPath` and :class:`RecoveryDecision`: the recovery ladder's paths (the report's
  recovery table, ``stalwart_recovery_seconds``) and the decisions that choose them (the ledger).
- :class:`NodeState`: a node's health state, and :data:`NEVER_CHECKED` for a node with no record.
"""

from __future__ import annotations

from collections.abc import Mapping

from .label import Label


class FailureKind(Label):
    CRASH = "crash"  # a worker killed by a signal or exiting non-zero without an exception record
    HANG = "hang"
    PEER_LOST = "peer_lost"
    AGENT_LOST = "agent_lost"
    EXCEPTION = "exception"  # raised by the training script: the user-error budget


class FaultClass(Label):
    """Who owns the fix."""

    USER = "user_program"  # the training script: a bug, an OOM, a desync
    SYSTEM = "system_software"  # drivers, filesystems, collectors, the scheduler
    HARDWARE = "hardware"  # a GPU, a link, a NIC, a PSU in one node
    FACILITY = "facility"  # shared infrastructure: a cooling loop, a PDU, a switch
    UNKNOWN = "unknown"


class Component(Label):
    """What broke."""

    GPU = "gpu"
    GPU_MEMORY = "gpu_memory"
    HOST_MEMORY = "host_memory"  # the node's RAM: the kernel OOM killer
    NVLINK = "nvlink"
    PCIE = "pcie"
    NIC = "nic"  # a NIC/HCA
    IB_LINK = "ib_link"
    MOUNT = "mount"
    STORAGE = "storage"  # a local disk or filesystem: an SSD, NVMe, an I/O error
    COOLING = "cooling"
    POWER = "power"
    SWITCH = "switch"
    HOST = "host"  # the whole host: its agent stopped answering
    STRAGGLER = "straggler"  # slow, cause not (yet) known
    USER_CODE = "user_code"
    NATIVE_CODE = "native_code"  # a crash in native code: a library, driver or extension
    EXTERNAL = "external"  # killed from outside the job: an operator, another process, the scheduler
    INJECTED = "injected"  # the run's chaos plan caused it: a test, not a real fault
    COLLECTOR = "collector"  # a monitor that stopped reporting
    COMMUNICATION = "communication"  # only when nothing below it explains the symptom
    UNKNOWN = "unknown"


# who owns the fix of a broken component when nothing else says (an incident's rule may say more)
FAULT_CLASS_OF: Mapping[Component, FaultClass] = {
    Component.GPU: FaultClass.HARDWARE,
    Component.GPU_MEMORY: FaultClass.HARDWARE,
    Component.NVLINK: FaultClass.HARDWARE,
    Component.PCIE: FaultClass.HARDWARE,
    Component.NIC: FaultClass.HARDWARE,
    Component.IB_LINK: FaultClass.HARDWARE,
    Component.POWER: FaultClass.HARDWARE,
    Component.HOST: FaultClass.HARDWARE,
    Component.COOLING: FaultClass.FACILITY,
    Component.SWITCH: FaultClass.FACILITY,
    Component.MOUNT: FaultClass.SYSTEM,
    Component.STORAGE: FaultClass.SYSTEM,
    Component.COLLECTOR: FaultClass.SYSTEM,
    Component.USER_CODE: FaultClass.USER,
    Component.HOST_MEMORY: FaultClass.USER,
}


def fault_class_of(component: Component) -> FaultClass:
    return FAULT_CLASS_OF.get(component, FaultClass.UNKNOWN)


class RecoveryPath(Label):
    """How an interruption was recovered, as the report's recovery table names it."""

    IN_PLACE = "in-place"  # the survivors stayed; only the failed ranks were replaced
    WARM = "warm"  # the workers forked again from a warm server
    COLD = "cold"  # the workers started from scratch
    MIXED = "mixed"  # some ranks warm, some cold


class RecoveryDecision(Label):
    """The ledger's decisions (``DecisionTaken.action``) that pick a rung of the recovery ladder."""

    IN_PLACE = "in_place"  # the failed ranks replaced in place
    SHRINK_IN_PLACE = "shrink_in_place"  # a lost node's survivors re-formed without it
    IN_PLACE_SKIPPED = "in_place_skipped"  # the rung was not tried, and why
    IN_PLACE_FAILED = "in_place_failed"  # the rung was tried and failed: the whole group restarts
    GROW_IN_PLACE = "grow_in_place"  # a returning node taken back in place
    GROW_IN_PLACE_FAILED = "grow_in_place_failed"  # the group goes on at its size
    RESTART = "restart"
    STOP = "stop"
    START_WARM = "start_warm"
    START_COLD = "start_cold"


class NodeState(Label):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    QUARANTINED = "quarantined"
    PROBATION = "probation"


# the cause of a restart that answered no failure: a node waiting to join, the group re-formed to take it
MEMBERSHIP = "membership"

# A node no check has recorded yet: the state readers show before a node's first record ("never
# checked", never "healthy": nothing was checked), and a node's first record starts from it.
NEVER_CHECKED = "unknown"

# every word of each kind, by the name a surface's label or field carries it under
WORDS: Mapping[str, frozenset[str]] = {
    "failure": frozenset(FailureKind),
    "cause": frozenset(FailureKind) | {MEMBERSHIP},
    "component": frozenset(Component),
    "fault_class": frozenset(FaultClass),
    "path": frozenset(RecoveryPath),
    "node_state": frozenset(NodeState) | {NEVER_CHECKED},
}
