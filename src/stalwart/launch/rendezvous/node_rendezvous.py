"""This node's rendezvous: torch.distributed.elastic's c10d rendezvous (as torchrun), or static node
ranks, and the store this node hosts for its workers.

Each round gets a fresh store on a fresh port for the workers (torchrun's agent store), so restarted
workers never see stale keys from an earlier round (the shared-store hang of torch >= 2.5). Hot spares
learn that the job is done through the round's store.

No call to the rendezvous store runs on the caller's thread without a deadline (launch/rendezvous/store_watch.py):
forming a round, announcing the end and closing run on a daemon thread that is given up once the store
has been silent longer than the store timeout; the membership the supervisor's tick and a hot spare
read is the latest answer of a background thread, or :class:`StoreUnreachable` once that silence is
over the store timeout."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

from ...errors import ConfigError
from ...job_key import JobKey, Refusals, SealedStore, Signer, UnsignedRecord
from ...node_name import validate_node_name
from ..clock import Clock, SystemClock
from ..ports import Round
from . import arrival
from .arrival import await_hosts, mark_finished, mark_workers, read_finished, read_workers
from .store_watch import StoreUnreachable, StoreWatch, within

DONE_KEY = "stalwart/done"
STALWART_BACKEND = "stalwart"  # launch/rendezvous/round_rendezvous.py on the c10d store
ETCD_BACKENDS = ("etcd", "etcd-v2")  # launch/rendezvous/etcd.py (torch's etcd-v2 name, the v3 API)
PROBE_KEY = "stalwart/probe"
CLOSE_S = 10.0  # torch's close_timeout: at most this long to close the rendezvous on the way out

__all__ = [
    "DONE_KEY",
    "NodeRendezvous",
    "StoreUnreachable",
    "c10d_probe",
    "local_addr",
    "make_handler",
    "rendezvous_probe",
]


class PeerExchange(Protocol):
    # Any: the round's store (torch's Store, imported lazily (heavy))
    def exchange(self, store: Any, group_rank: int, num_nodes: int) -> None: ...


def local_addr(endpoint: str) -> str:
    """The address other nodes reach this one at, given the rendezvous endpoint."""
    host = endpoint.rpartition(":")[0] or endpoint
    if host in ("localhost", "") or host.startswith("127."):
        return "127.0.0.1"
    return socket.gethostname()


class NodeRendezvous:
    """Implements :class:`stalwart.launch.ports.Rendezvous` for a run configuration."""

    def __init__(
        self,
        cfg,
        memory: PeerExchange | None = None,
        clock: Clock | None = None,
        *,
        key: JobKey,
        note: Callable[[str], None] = lambda text: None,
        # Any: the run's config and a client of its store (arrival.store_for)
        store_for: Callable[[Any, float], Any] = arrival.store_for,
    ) -> None:
        self.cfg = cfg
        self.store_for = store_for  # a client of the rendezvous store for the job's marks (arrival.py)
        self.signer = key.signer(cfg.rendezvous.id or cfg.run_id)  # seals every record another agent reads
        self.refusals = Refusals(note)  # records that failed their seal: ignored, counted, noted once
        self.memory = memory  # the node memory tier: its peers learn each other's address per round
        self.clock: Clock = clock or SystemClock()
        # Any: torch's rendezvous handler and stores, imported lazily (heavy)
        self.handler: Any = None  # torch's rendezvous handler, made at the first c10d round
        self.store: Any = None  # this round's store (c10d)
        # Any: as above
        self.worker_store: Any = None  # the TCPStore this node hosts for this round's workers
        self.watch: StoreWatch | None = None  # the store's reader off the tick (c10d), from the first round
        self.hosting = False  # this agent serves the c10d rendezvous store: the job ends if it leaves
        # how the first round's start-up window ended (launch/rendezvous/arrival.py)
        self.arrivals: arrival.Arrivals | None = None

    @property
    def elastic(self) -> bool:
        return self.handler is not None

    @property
    def timeout_s(self) -> float:
        return float(self.cfg.rendezvous.store_timeout_s)

    @property
    def what(self) -> str:
        return f"the rendezvous store at {self.cfg.rendezvous.endpoint}"

    def meet(self) -> Round:
        cfg = self.cfg
        self.worker_store = None  # a fresh store every attempt (torch >= 2.5 hangs on a reused one)
        if not cfg.use_c10d:
            return self._static()
        if self.watch is None:
            probe = rendezvous_probe(cfg, min(5.0, self.timeout_s / 2))
            self.watch = StoreWatch(probe, self.clock, probe_deadline_s=min(5.0, self.timeout_s / 2)).start()
        watch = self.watch
        watch.asking(None)  # torch's handler is the round's alone while it forms
        met = within(lambda: self._form(watch), watch, self.timeout_s, self.what)
        watch.asking(self._ask)
        return met

    def _hosting(self) -> None:
        self.hosting = True

    def _ask(self) -> tuple[int, bool]:
        return self.handler.num_nodes_waiting(), bool(self.store.check([DONE_KEY]))

    def _form(self, watch: StoreWatch) -> Round:
        with watch.lock:  # an ask under way finishes first (or the store is silent and this gives up)
            return self._next_round()

    def _next_round(self) -> Round:
        cfg = self.cfg
        if self.handler is None:
            self.handler = make_handler(
                cfg,
                self.sealed_backend,
                self.refusals.note,
                self._hosting,
                signer=self.signer,
                refusals=self.refusals,
            )
            self._await_hosts()
        info = self.handler.next_rendezvous()
        group_rank, num_nodes = info.rank, info.world_size
        self.store = info.store
        store = self.sealed(info.store)  # every record the other agents read is signed
        store.set(f"stalwart/name/{group_rank}", cfg.node_name)
        if group_rank == 0:
            addr = cfg.rendezvous.local_addr or local_addr(cfg.rendezvous.endpoint)
            port = self._host_worker_store(addr, 0)
            store.set("stalwart/master", f"{addr}:{port}")
            self._mark_workers(addr, port)
        try:
            master = store.get("stalwart/master").decode()
            names = tuple(
                validate_node_name(store.get(f"stalwart/name/{i}").decode()) for i in range(num_nodes)
            )
        except (UnsignedRecord, ConfigError, UnicodeDecodeError) as exc:
            raise RuntimeError(f"the rendezvous store holds a record that is not this job's: {exc}") from None
        addr, _, port_text = master.rpartition(":")
        if len(set(names)) != len(names):
            raise RuntimeError(
                f"two agents use the same node name ({', '.join(names)}); give each --node-name"
            )
        if self.memory is not None:
            self.memory.exchange(store, group_rank, num_nodes)
        return Round(group_rank, names, addr, int(port_text))

    # Any: torch's Store, imported lazily (heavy)
    def sealed(self, store: Any) -> SealedStore:
        """``store`` with every value sealed with the job key on write and checked on read."""
        return SealedStore(store, self.signer, self.refusals)

    # Any: torch's rendezvous state backend, imported lazily (heavy)
    def sealed_backend(self, backend: Any) -> Any:
        """torch's rendezvous state backend with the state sealed (launch/rendezvous/sealed.py)."""
        from .sealed import SealedBackend  # deferred: heavy (numpy, torch)

        return SealedBackend(backend, self.signer, self.refusals)

    def _await_hosts(self) -> None:
        """The first round's start-up window (launch/rendezvous/arrival.py): wait, bounded, for every host of
        --nnodes MAX to count itself in before joining, so hosts that start apart form attempt 0."""
        cfg = self.cfg
        window = float(cfg.rendezvous.startup_window_s)
        if cfg.min_nodes >= cfg.max_nodes or window <= 0:
            return  # torch's round already waits for every host (or the window is off)

        try:
            store = self.store_for(cfg, min(5.0, self.timeout_s / 2))
            got = await_hosts(store, cfg.rendezvous.id, cfg.max_nodes, window, self.clock)
        except Exception:  # noqa: BLE001 - the round itself says what is wrong with the store
            return
        self.arrivals = got

    def _mark_workers(self, addr: str, port: int) -> None:
        """Record the round's worker store for nodes that arrive while the job runs (launch/inplace/rejoin.py;
        best effort, bounded: without it they join the rendezvous as before)."""
        cfg = self.cfg
        if not cfg.reform.enabled or cfg.max_nodes < 2:
            return

        try:
            mark_workers(
                self.sealed(self.store_for(cfg, min(5.0, self.timeout_s / 2))), cfg.rendezvous.id, addr, port
            )
        except Exception:  # noqa: BLE001 - an arriving node then joins the rendezvous instead
            pass

    def workers_elsewhere(self) -> tuple[str, int] | None:
        """Where a running round of this job hosts its worker store (launch/rendezvous/arrival.py), or None: no
        round recorded one, the store did not answer within the probe deadline, or one node. A c10d
        endpoint where nothing listens yet (the job is starting, this agent may be its host) answers
        None at once: a store client would retry until its timeout."""
        cfg = self.cfg
        if not cfg.use_c10d or not cfg.reform.enabled or cfg.max_nodes < 2:
            return None
        if cfg.rendezvous.backend not in ETCD_BACKENDS:
            # deferred: heavy (numpy, torch)
            from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

            host, port = parse_rendezvous_endpoint(cfg.rendezvous.endpoint, default_port=29400)
            if not listening(host, port, min(1.0, self.timeout_s / 2)):
                return None

        try:
            return read_workers(
                self.sealed(self.store_for(cfg, min(5.0, self.timeout_s / 2))), cfg.rendezvous.id
            )
        except Exception:  # noqa: BLE001 - no store (yet): the rendezvous decides
            return None

    def finished_elsewhere(self):
        """The mark a job that already succeeded left in etcd (launch/rendezvous/arrival.py), or None: none there,
        no etcd member answered within the probe deadline, or a c10d store (it ends with its host)."""
        cfg = self.cfg
        if not cfg.use_c10d or cfg.rendezvous.backend not in ETCD_BACKENDS:
            return None

        try:
            return read_finished(
                self.sealed(self.store_for(cfg, min(5.0, self.timeout_s / 2))), cfg.rendezvous.id
            )
        except Exception:  # noqa: BLE001 - no store (yet): the rendezvous decides
            return None

    def leave_finished_mark(self, mark) -> None:
        """Tell agents that arrive later that the job succeeded (etcd; best effort, bounded)."""
        cfg = self.cfg
        if not cfg.use_c10d or cfg.rendezvous.backend not in ETCD_BACKENDS:
            return

        try:
            mark_finished(
                self.sealed(self.store_for(cfg, min(5.0, self.timeout_s / 2))), cfg.rendezvous.id, mark
            )
        except Exception:  # noqa: BLE001 - the store went with the job: the run directory says it
            pass

    def _static(self) -> Round:
        """One node, or torchrun's static node ranks (--node-rank/--master-addr/--master-port)."""
        cfg = self.cfg
        self.store = None
        addr = cfg.rendezvous.master_addr or "127.0.0.1"
        port = cfg.rendezvous.master_port
        if cfg.max_nodes == 1 or cfg.rendezvous.node_rank == 0:
            port = self._host_worker_store(addr, port)
        if cfg.max_nodes == 1:
            return Round(0, (cfg.node_name,), addr, port)
        names = tuple(
            cfg.node_name if i == cfg.rendezvous.node_rank else f"node-rank-{i}" for i in range(cfg.max_nodes)
        )
        return Round(cfg.rendezvous.node_rank, names, addr, port)

    def _host_worker_store(self, addr: str, port: int) -> int:
        """Host this attempt's store for the workers (torchrun's agent store): a socket bound to
        ``addr`` only (loopback for one node) and held from bind to close, so no other process can
        take the port in between, and no worker listens on every interface. Returns the port."""

        from torch.distributed import TCPStore  # deferred: heavy (numpy, torch)

        host = "127.0.0.1" if addr in ("", "localhost") else addr
        try:
            sock = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=1024
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} for the workers' store: {exc.strerror}",
                "free the port or choose another --master-port/--local-addr",
            ) from None
        port = sock.getsockname()[1]
        fd = sock.detach()  # the store's server owns the listening socket from here and closes it
        timeout = datetime.timedelta(seconds=self.cfg.hang.pg_timeout_s)
        try:
            try:
                store = TCPStore(
                    host, port, None, True, timeout=timeout, wait_for_workers=False, master_listen_fd=fd
                )
            except NotImplementedError:  # torch 2.6: its libuv server cannot take a listening socket
                store = TCPStore(
                    host,
                    port,
                    None,
                    True,
                    timeout=timeout,
                    wait_for_workers=False,
                    master_listen_fd=fd,
                    use_libuv=False,
                )
        except Exception:
            os.close(fd)
            raise
        self.worker_store = store
        return port

    def nodes_waiting(self) -> int | None:
        """The latest answer of the background reader (never waits); raises StoreUnreachable once the
        store has been silent over the store timeout."""
        if self.watch is None or self.handler is None:
            return None
        return self.watch.check(self.timeout_s, self.what).waiting

    def job_done(self) -> bool:
        if self.watch is None:
            raise StoreUnreachable("no rendezvous round was formed")
        return self.watch.check(self.timeout_s, self.what).done

    def announce_done(self) -> None:
        store, watch = self.store, self.watch
        if store is not None and watch is not None:
            within(lambda: store.set(DONE_KEY, "1"), watch, self.timeout_s, self.what)

    def close(self, *, leaving: bool) -> None:
        watch, handler = self.watch, self.handler
        if watch is not None:
            watch.asking(None)
        if handler is not None and watch is not None and not leaving:  # it would end the job for all
            try:
                within(handler.shutdown, watch, min(CLOSE_S, self.timeout_s), self.what)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        if watch is not None:
            watch.stop()
        self.worker_store = None  # the last reference: the server stops and closes its socket


def listening(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts connections at ``host:port`` (a refused port answers at once, a
    silent one within ``timeout_s``)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def make_handler(
    cfg,
    # Any: seal wraps torch's rendezvous state backend (imported lazily: heavy)
    seal: Callable[[Any], Any],
    note: Callable[[str], None] = lambda text: None,
    hosted: Callable[[], None] = lambda: None,
    *,
    signer: Signer | None = None,
    refusals: Refusals | None = None,
):
    """torch's dynamic rendezvous handler for the run configuration: on the c10d store of one host
    (torchrun's, bound to the endpoint's address), or on etcd (launch/rendezvous/etcd.py); ``seal``
    wraps its state backend (launch/rendezvous/sealed.py). ``--rdzv-backend stalwart``: Stalwart's own
    handler on the same store (launch/rendezvous/round_rendezvous.py), its records sealed by ``signer``
    (refused ones counted in ``refusals``)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters  # deferred: heavy (numpy, torch)

    # deferred: heavy (numpy, torch)
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from .sealed import c10d_store  # deferred: heavy (numpy, torch)

    # torch shares one TCPStore across rounds and writes MASTER_ADDR into a round's store only
    # when its rank 0 is new to that role: a node joining a group whose rank 0 already led
    # the previous round waits on the key forever. Stalwart never hands that store to workers.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if cfg.rendezvous.backend in ETCD_BACKENDS:
        from .etcd import make_etcd_handler  # deferred: heavy (numpy, torch)

        return make_etcd_handler(cfg, seal)
    if cfg.rendezvous.backend == STALWART_BACKEND:
        return _round_handler(cfg, signer, refusals, note, hosted)
    conf: dict[str, float] = {
        "join_timeout": cfg.rendezvous.timeout_s,
        "last_call_timeout": cfg.rendezvous.last_call_s,
        "close_timeout": 10,
        "keep_alive_interval": max(1, int(cfg.rendezvous.keepalive_s)),
        "keep_alive_max_attempt": 3,
        "read_timeout": max(1, int(cfg.rendezvous.store_timeout_s)),
    }
    params = RendezvousParameters(
        backend="c10d",
        endpoint=cfg.rendezvous.endpoint,
        run_id=cfg.rendezvous.id,
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.max_nodes,
        local_addr=cfg.rendezvous.local_addr or None,
        **conf,
    )
    # deferred: heavy (numpy, torch)
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    store = c10d_store(
        cfg.rendezvous.endpoint, cfg.rendezvous.host, float(conf["read_timeout"]), note, hosted
    )
    return create_handler(store, seal(C10dRendezvousBackend(store, cfg.rendezvous.id)), params)


def _round_handler(
    cfg,
    signer: Signer | None,
    refusals: Refusals | None,
    note: Callable[[str], None],
    hosted: Callable[[], None],
):
    """Stalwart's own rendezvous handler on the c10d store (hosted as torch's c10d backend's)."""
    from .round_policy import Bounds  # deferred: with the handler below
    from .round_rendezvous import RoundRendezvousHandler  # deferred: heavy (numpy, torch)
    from .sealed import c10d_store  # deferred: heavy (numpy, torch)

    if signer is None:
        raise ValueError("--rdzv-backend stalwart needs the job key's signer")
    read_timeout = float(max(1, int(cfg.rendezvous.store_timeout_s)))
    store = c10d_store(cfg.rendezvous.endpoint, cfg.rendezvous.host, read_timeout, note, hosted)
    return RoundRendezvousHandler(
        store,
        cfg.rendezvous.id,
        signer,
        refusals or Refusals(note),
        Bounds(cfg.min_nodes, cfg.max_nodes, float(cfg.rendezvous.last_call_s)),
        timeout_s=float(cfg.rendezvous.timeout_s),
        local_addr=cfg.rendezvous.local_addr or None,
    )


def rendezvous_probe(cfg, timeout_s: float):
    """One round trip to the rendezvous's store (etcd's quorum, or the c10d host's TCPStore)."""
    if cfg.rendezvous.backend in ETCD_BACKENDS:
        from .etcd import etcd_probe  # deferred: heavy (numpy, torch)

        return etcd_probe(cfg, timeout_s)
    return c10d_probe(cfg.rendezvous.endpoint, timeout_s)


def c10d_probe(endpoint: str, timeout_s: float):
    """One round trip to the c10d rendezvous store on a new connection (raises when it fails)."""

    from torch.distributed import TCPStore  # deferred: heavy (numpy, torch)

    # deferred: heavy (numpy, torch)
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
    timeout = datetime.timedelta(seconds=timeout_s)

    def probe() -> None:
        store = TCPStore(host, port, None, False, timeout=timeout, wait_for_workers=False)
        store.check([PROBE_KEY])

    return probe
