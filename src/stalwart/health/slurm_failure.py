"""What a failed Slurm command means, and the hint that fits it.

``scontrol`` and ``sinfo`` fail the same way (exit 1) whether Slurm is not configured on this
machine, slurmctld is down, the caller lacks the rights or the node name is wrong; only their
message tells these apart. Each gets its own hint: a machine with no Slurm configuration must not
be told to check its permissions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..errors import SchedulerError

NO_CONFIG_HINT = (
    "on a node of a Slurm cluster, set SLURM_CONF to the cluster's slurm.conf or install it as "
    "/etc/slurm/slurm.conf; on a machine without Slurm, use the local backend: --backend local, "
    "or stalwart run --health-backend local"
)

# Slurm 22.05's words, lower-cased: no file and no configless source (DNS SRV record) was found, or
# SLURM_CONF names a file that is not there
_NO_CONFIG = ("could not establish a configuration source", "cannot stat file", "unable to status file")
_BAD_CONFIG = ("unable to process configuration file",)
_HINTS = (
    (
        ("access/permission denied", "invalid user id"),
        "drains and resumes need Slurm's operator rights: run as root or SlurmUser",
    ),
    (("invalid node name",), "check the node name with 'sinfo -N'"),
    (
        ("unable to contact slurm controller", "connection refused", "socket timed out"),
        "slurmctld does not answer: check that it runs ('scontrol ping') and that SLURM_CONF names "
        "this cluster's slurm.conf",
    ),
)


def missing_slurm_conf(env: Mapping[str, str]) -> str:
    """Why the configuration ``SLURM_CONF`` names cannot be used ("" when it is not set or exists)."""
    path = env.get("SLURM_CONF", "")
    if path and not os.path.isfile(path):
        return f"SLURM_CONF={path} is not a file"
    return ""


def slurm_failure(argv: Sequence[str], code: int, output: str) -> SchedulerError:
    """The error for a Slurm command that exited ``code`` after printing ``output``."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    said = (lines[-1] if lines else "no message")[:300]  # Slurm ends with its fatal line
    low = output.lower()
    if any(m in low for m in _NO_CONFIG):
        return SchedulerError(f"no Slurm configuration found: {said}", NO_CONFIG_HINT)
    if any(m in low for m in _BAD_CONFIG):
        return SchedulerError(
            f"Slurm's configuration cannot be read: {said}",
            "fix the slurm.conf that SLURM_CONF (or /etc/slurm/slurm.conf) names",
        )
    hint = next((h for marks, h in _HINTS if any(m in low for m in marks)), "see Slurm's message")
    return SchedulerError(f"{' '.join(argv[:3])} failed (exit {code}): {output.strip()[:300]}", hint)
