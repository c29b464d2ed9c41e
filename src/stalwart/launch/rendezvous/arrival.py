"""Membership edges of a multi-host job: hosts that start apart, and a host that arrives after the end.

**The start-up window.** torch's rendezvous completes a round at once when ``--nnodes MAX`` hosts
joined, and otherwise ``last_call_timeout`` after the minimum joined. That window (3 s here) serves
every round, re-forms after a lost host included, where a long one would delay every recovery. On the
first round only, an agent first counts itself in the rendezvous store and waits, bounded by
``--rdzv-startup-window`` (default 30 s, torch's last call), until MAX agents have counted
themselves: hosts that start seconds apart (a scheduler's skew, a slow import, a container pull)
form attempt 0 together, and the wait ends as soon as the last one arrives. It only ever costs time
when fewer than MAX hosts start at all.

**The finished mark.** When a job on etcd succeeds, its agents leave ``stalwart/finished/<run id>``
(the final step and when) there; an agent that arrives later reads it before it joins, says so and
exits 0. A c10d store ends with the agent that hosts it, so there a late agent learns the end from
a run directory the hosts share (its ledger's verdict, commands/run.py), or not at all.

**The workers' store.** The first node of every round records where it hosts the round's worker store
(``stalwart/workers/<run id>``). A node that arrives while the job runs reads it to find the group's
in-place board (launch/inplace/rejoin.py) before it joins the rendezvous.

Every store call is bounded (the store's own timeout); the waits take their time from the injected
clock.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from ..clock import Clock

ARRIVED_KEY = "stalwart/arrived"
FINISHED_KEY = "stalwart/finished"
WORKERS_KEY = "stalwart/workers"
POLL_S = 0.2


@dataclass(frozen=True)
class Arrivals:
    here: int  # agents counted when the wait ended
    waited_s: float
    complete: bool  # every host of --nnodes MAX arrived


def wait_for_hosts(count: Callable[[], int], max_nodes: int, window_s: float, clock: Clock) -> Arrivals:
    """Poll ``count()`` until it reaches ``max_nodes`` or ``window_s`` has passed (bounded)."""
    start = clock.monotonic()
    while True:
        here = count()
        waited = clock.monotonic() - start
        if here >= max_nodes or waited >= window_s:
            return Arrivals(here, waited, here >= max_nodes)
        clock.sleep(min(POLL_S, window_s - waited))


@dataclass(frozen=True)
class FinishedMark:
    step: int
    ended_at: float

    def encode(self) -> str:
        return json.dumps({"step": self.step, "ended_at": self.ended_at})

    @staticmethod
    def decode(raw: bytes) -> FinishedMark | None:
        """The mark a finished job left (None for anything that is not one: it is data, not code)."""
        try:
            d = json.loads(raw)
            return FinishedMark(int(d["step"]), float(d["ended_at"]))
        except (ValueError, KeyError, TypeError):
            return None

    def message(self, run_id: str) -> str:
        when = datetime.fromtimestamp(self.ended_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        step = f" at step {self.step}" if self.step >= 0 else ""
        return (
            f"run {run_id} already succeeded{step} on {when} (the rendezvous says so); this agent arrived "
            "after the end: nothing to join, nothing launched"
        )


class MarkStore(Protocol):
    """What a mark needs of a store: torch's Store, an EtcdStore (etcd.py) or a SealedStore (sealed.py)."""

    def set(self, key: str, value: str | bytes) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...


class CountStore(Protocol):
    """What the count of arrived hosts needs of a store (torch's Store or an EtcdStore)."""

    def add(self, key: str, amount: int) -> int: ...


def mark_workers(store: MarkStore, run_id: str, addr: str, port: int) -> None:
    store.set(f"{WORKERS_KEY}/{run_id}", json.dumps({"addr": addr, "port": port}))


def read_workers(store: MarkStore, run_id: str) -> tuple[str, int] | None:
    """Where the running round hosts its worker store (None: no round recorded one, or not a record)."""
    key = f"{WORKERS_KEY}/{run_id}"
    if not store.check([key]):
        return None
    try:
        d = json.loads(store.get(key))
        addr, port = d["addr"], d["port"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(addr, str) or not addr or not isinstance(port, int) or isinstance(port, bool):
        return None  # JSON true reads as the int 1
    if not 0 < port < 65536:
        return None
    return addr, port


# Any: torch's TCPStore (imported lazily: heavy) or an EtcdStore, used as both protocols above
def store_for(cfg, timeout_s: float) -> Any:
    """A client of the rendezvous store with ``add``/``set``/``check``/``get`` (a torch Store):
    the c10d host's TCPStore on a new connection, or a key prefix in etcd."""
    if cfg.rendezvous.backend in ("etcd", "etcd-v2"):
        from .etcd import EtcdStore, etcd_client  # deferred: heavy (numpy, torch)

        client = etcd_client(cfg, timeout_s)
        return EtcdStore(client, f"/stalwart/marks/{cfg.rendezvous.id}", timeout_s=timeout_s)

    from torch.distributed import TCPStore  # deferred: heavy (numpy, torch)

    # deferred: heavy (numpy, torch)
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(cfg.rendezvous.endpoint, default_port=29400)
    return TCPStore(host, port, None, False, timeout=dt.timedelta(seconds=timeout_s), wait_for_workers=False)


def await_hosts(store: CountStore, run_id: str, max_nodes: int, window_s: float, clock: Clock) -> Arrivals:
    """Count this agent in, then wait (bounded) for the others (the first round's start-up window)."""
    key = f"{ARRIVED_KEY}/{run_id}"
    store.add(key, 1)
    return wait_for_hosts(lambda: int(store.add(key, 0)), max_nodes, window_s, clock)


def read_finished(store: MarkStore, run_id: str) -> FinishedMark | None:
    key = f"{FINISHED_KEY}/{run_id}"
    if not store.check([key]):
        return None
    return FinishedMark.decode(store.get(key))


def mark_finished(store: MarkStore, run_id: str, mark: FinishedMark) -> None:
    store.set(f"{FINISHED_KEY}/{run_id}", mark.encode())


__all__ = [
    "Arrivals",
    "FinishedMark",
    "await_hosts",
    "mark_finished",
    "mark_workers",
    "read_finished",
    "read_workers",
    "store_for",
    "wait_for_hosts",
]
