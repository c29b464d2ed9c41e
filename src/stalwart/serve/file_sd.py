"""Prometheus file-based service discovery for the agents of a Slurm job.

Each agent writes one JSON file (``stalwart-<job>-<node>.json``) naming its metrics endpoint; point a
``file_sd_configs`` entry at the directory. Written atomically (a fresh ``mkstemp`` file renamed over the target, so a link planted in a shared
directory is replaced, never followed), removed at the end.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError


def slurm_labels(env: Mapping[str, str]) -> dict[str, str] | None:
    """Labels of the Slurm job this process belongs to, or None outside Slurm."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    labels = {"slurm_job_id": job}
    for key, label in (
        ("SLURM_JOB_NAME", "slurm_job_name"),
        ("SLURMD_NODENAME", "slurm_node"),
        ("SLURM_JOB_PARTITION", "slurm_partition"),
    ):
        if env.get(key):
            labels[label] = env[key]
    return labels


def write_target(directory: str | Path, host: str, port: int, labels: Mapping[str, str]) -> Path:
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create file_sd directory {d}: {exc.strerror}", "choose a writable directory"
        ) from exc
    name = f"stalwart-{labels.get('slurm_job_id', 'job')}-{labels.get('slurm_node', host)}.json"
    path = d / name
    text = json.dumps([{"targets": [f"{host}:{port}"], "labels": dict(labels)}], indent=1)
    # a fresh, unpredictable name created O_EXCL (mkstemp), then an atomic rename over the target:
    # a link planted at either name in a shared directory is replaced, never written through
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=d)
    try:
        with open(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # Prometheus, another user, reads it; it names an address, no secret
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
