"""The simulator's buckets are the report's (``account.goodput.BUCKETS``) plus three that only a
simulation can see; this module owns the mapping.

* ``wait_nodes``: waiting for a repaired node (no spare left, the job cannot shrink). A real run sees
  this as time between detection and the next first step: the report's ``restart``.
* ``shrunk``: throughput lost while an elastic job runs on fewer nodes. The report measures wall time,
  and a shrunk job's steps are wall-clock productive: the report's ``productive``.
* ``replica_away``: throughput lost while a failed replica group is away (strategy ``replica``); the
  other groups keep stepping, so for the report it is ``productive`` too.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..account.goodput import BUCKETS as REPORT_BUCKETS

SIM_ONLY = {"wait_nodes": "restart", "shrunk": "productive", "replica_away": "productive"}
SIM_BUCKETS: tuple[str, ...] = tuple(REPORT_BUCKETS) + tuple(SIM_ONLY)


def to_report(buckets: Mapping[str, float]) -> dict[str, float]:
    """Fold simulator buckets into the report's, summing what maps to the same name."""
    out = dict.fromkeys(REPORT_BUCKETS, 0.0)
    for name, value in buckets.items():
        target = SIM_ONLY.get(name, name)
        if target not in out:
            raise KeyError(f"unknown bucket {name!r}")
        out[target] += float(value)
    return out
