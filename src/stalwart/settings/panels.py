"""The help panels of ``stalwart run``: which heading each setting's flag is listed under, and the
mark of the settings that act only for scripts using the SDK (part of the one schema: a group's
panel sits on its field in ``RunConfig``, a setting's own on its ``Setting``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.label import Label

NEEDS_SDK = "(needs the SDK)"  # appended to the help of a setting that only SDK scripts use


class Panel(Label):
    """A heading of ``stalwart run --help``; the help lists them in this order."""

    TORCHRUN = "torchrun-compatible"
    RUN = "Run"
    RECOVERY = "Recovery"
    HANGS = "Hang detection"
    DIAGNOSIS = "Diagnosis and stragglers"
    HEALTH = "Node health"
    OBSERVABILITY = "Observability (metrics, notifications)"
    CHAOS = "Fault injection (testing)"
    MULTI_NODE = "Multi-node and security"
    ADVANCED = "Advanced"


@dataclass(frozen=True)
class Group:
    """Marks a settings group's field in ``RunConfig``: the panel of its flags (a setting may name
    its own) and whether all of them need the SDK."""

    panel: Panel
    sdk: bool = False
