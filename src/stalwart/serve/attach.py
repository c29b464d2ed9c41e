"""What ``stalwart run`` attaches to its agent: the run's exporter and its notifier (both optional).

Nothing here can fail the run once it started: the exporter reads ledgers in its own thread and the
notifier posts from its own bounded queue. A port that cannot be bound is a configuration error
raised before the agent starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..account.mfu import parse_model_spec
from ..events import Event
from .notify import RunNotifier, Target

if TYPE_CHECKING:
    from ..launch.config import RunConfig  # pulls in pydantic
    from .exporter import RunExporter  # imported when a port is asked for (prometheus-client)

FILE_SD_ENV = "STALWART_METRICS_FILE_SD_DIR"  # under Slurm: where to write the file_sd target


@dataclass
class Observability:
    exporter: RunExporter | None = None
    notifier: RunNotifier | None = None
    say: Callable[[str], None] = print

    @classmethod
    def from_config(cls, cfg: RunConfig, *, say: Callable[[str], None] = print) -> Observability:
        exporter = None
        if cfg.observe.metrics_port is not None:
            from .exporter import RunExporter  # deferred: heavy (yaml)

            if cfg.run_dir is None:  # a programming error: the caller skipped RunConfig.resolved()
                raise ValueError("Observability.from_config needs a resolved RunConfig (run_dir set)")
            exporter = RunExporter(
                cfg.run_dir,
                addr=cfg.observe.metrics_addr,
                port=cfg.observe.metrics_port,
                file_sd_dir=os.environ.get(FILE_SD_ENV) or None,
                model=parse_model_spec(cfg.observe.metrics_model) if cfg.observe.metrics_model else None,
            )
        urls = cfg.observe.notify_urls()
        notifier = RunNotifier([Target.parse(u) for u in urls]) if urls else None
        return cls(exporter, notifier, say)

    def chain(self, notify: Callable[[Event], None]) -> Callable[[Event], None]:
        """The agent's notify callback: the console first, then the notifier (which never raises)."""
        if self.notifier is None:
            return notify
        notifier = self.notifier

        def both(ev: Event) -> None:
            notify(ev)
            notifier(ev)

        return both

    def start(self) -> None:
        if self.exporter is not None:
            from .httpd import warn_if_exposed  # deferred: heavy (aiohttp), only with --metrics-port

            self.exporter.start()
            warn_if_exposed("the --metrics-port exporter", self.exporter.server.address[0])
            self.say(f"metrics: {self.exporter.url}")

    def stop(self) -> None:
        if self.exporter is not None:
            self.exporter.server.watcher.stop()  # no background cycle races the final one
            self.exporter.server.watcher.refresh()  # the final state (verdict) ...
            self.exporter.server.linger()  # ... is scraped once more before the endpoint closes (bounded)
            self.exporter.stop()
        if self.notifier is not None:
            self.notifier.close(5.0)
