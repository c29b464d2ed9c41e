"""The exporter of one run, as ``stalwart run`` starts and stops it around the agent."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

from ..account.mfu import ModelSpec
from .file_sd import slurm_labels, write_target
from .metrics import MetricsServer
from .watcher import RunWatcher


class RunExporter:
    """Watcher thread + ``/metrics`` endpoint (+ a file_sd target under Slurm). Never blocks the agent."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        addr: str = "127.0.0.1",
        port: int = 0,
        interval_s: float = 1.0,
        file_sd_dir: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        model: ModelSpec | None = None,
    ) -> None:
        self.server = MetricsServer(
            RunWatcher(run_dir, interval_s=interval_s, model=model), addr=addr, port=port
        )
        self.sd_path: Path | None = None
        labels = slurm_labels(os.environ if env is None else env)
        if labels is not None and file_sd_dir:
            host, port = self.server.address
            if host in ("0.0.0.0", "::"):
                host = socket.gethostname()
            self.sd_path = write_target(file_sd_dir, host, port, labels)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> RunExporter:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        if self.sd_path is not None:
            self.sd_path.unlink(missing_ok=True)
