"""Route around a sick link: turn an incident naming a NIC/HCA into NCCL environment changes.

``NCCL_IB_HCA`` selects the InfiniBand HCAs NCCL may use: a comma-separated list of ``name[:port]``
entries that match by *prefix* (``mlx5_1`` also matches ``mlx5_10``), ``=`` in front of the list
makes the entries exact, ``^`` in front excludes them, ``^=`` excludes exact names. The changes
are for the *next* attempt (NCCL reads them at communicator creation); a running job is untouched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import ConfigError
from .incident import Component, Incident

_HCA = re.compile(r"^(?P<dev>[A-Za-z0-9_]+)(?:[/:](?P<port>\d+))?$")


@dataclass(frozen=True)
class RouteChange:
    possible: bool
    env: tuple[tuple[str, str], ...]  # variables to set for the next attempt
    reason: str


def _parse_list(value: str) -> tuple[bool, bool, list[str]]:
    v = value.strip()
    exclude = v.startswith("^")
    v = v[1:] if exclude else v
    exact = v.startswith("=")
    v = v[1:] if exact else v
    return exclude, exact, [e.strip() for e in v.split(",") if e.strip()]


def _matches(entry: str, dev: str, exact: bool) -> bool:
    name = entry.split(":")[0]
    return name == dev if exact else dev.startswith(name)


def route_around_hca(hca: str, env: Mapping[str, str], available: Sequence[str] = ()) -> RouteChange:
    """NCCL_IB_HCA for the next attempt without ``hca`` (``mlx5_3``, ``mlx5_3/1`` or ``mlx5_3:1``).

    ``env``: the job's current environment. ``available``: the node's HCA names, needed only when the
    current value includes by prefix (the exclusion cannot be combined with an inclusion list)."""
    m = _HCA.match(hca.strip())
    if not m:
        raise ConfigError(f"cannot route around {hca!r}: not an HCA name like mlx5_3 or mlx5_3:1")
    dev, port = m.group("dev"), m.group("port")
    target = f"{dev}:{port}" if port else dev
    current = env.get("NCCL_IB_HCA", "").strip()
    if not current:
        new = f"^={target}"
        return RouteChange(
            True, (("NCCL_IB_HCA", new),), f"NCCL_IB_HCA={new}: exclude {target}, keep the others"
        )
    exclude, exact, entries = _parse_list(current)
    if exclude:
        if any(_matches(e, dev, exact) for e in entries):
            return RouteChange(False, (), f"{target} is already excluded by NCCL_IB_HCA={current}")
        if exact:
            new = "^=" + ",".join([*entries, target])
        else:  # keep the prefix entries; an exact exclusion cannot be mixed in, so list the name as a prefix
            new = "^" + ",".join([*entries, target])
        return RouteChange(True, (("NCCL_IB_HCA", new),), f"NCCL_IB_HCA={new}: also exclude {target}")
    expanded = False
    if exact:
        kept = [
            e
            for e in entries
            if not (e.split(":")[0] == dev and (not port or e.endswith(f":{port}") or ":" not in e))
        ]
    else:
        if any(_matches(e, dev, False) and e.split(":")[0] != dev for e in entries):
            if not available:
                return RouteChange(
                    False,
                    (),
                    f"NCCL_IB_HCA={current} selects {dev} by prefix; pass the node's "
                    f"HCA names to list the others exactly",
                )
            entries = [a for a in available if any(_matches(e, a, False) for e in entries)]
            expanded = True
        kept = [e for e in entries if e.split(":")[0] != dev]
    if len(kept) == len(entries):
        return RouteChange(False, (), f"NCCL_IB_HCA={current} does not use {target}: nothing to route around")
    if not kept:
        return RouteChange(
            False, (), f"{target} is the only HCA in NCCL_IB_HCA={current}: no path left, drain"
        )
    new = ("=" if exact or expanded else "") + ",".join(kept)
    return RouteChange(True, (("NCCL_IB_HCA", new),), f"NCCL_IB_HCA={new}: {target} removed from the list")


def route_incident(
    incident: Incident, hca: str, env: Mapping[str, str], available: Sequence[str] = ()
) -> Incident:
    """The incident with its action set to routing around ``hca`` (and the env to apply), or, when
    that is impossible, to draining the node; the reason goes into the evidence."""
    if incident.component not in (Component.NIC, Component.IB_LINK):
        raise ConfigError(f"incident {incident.rule} names {incident.component.value}, not a NIC or IB link")
    change = route_around_hca(hca, env, available)
    if change.possible:
        return replace(
            incident,
            action="route_around_hca",
            env=change.env,
            cause=f"{incident.cause}; next attempt routes around {hca} ({change.reason})",
            evidence=(*incident.evidence, change.reason),
        )
    return replace(incident, action="drain_check_link", evidence=(*incident.evidence, change.reason))
