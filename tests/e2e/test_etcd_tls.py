"""Two agents on loopback meet through an etcd member that serves TLS and takes only clients with a
certificate its CA signed (``--client-cert-auth``), and train a small job to success: every etcd
client of the run (the rendezvous, its store, the probe, the start-up and finished marks) goes with
``--etcd-cacert``/``--etcd-cert``/``--etcd-key``."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from etcdutil import Certs, etcd_member, make_certs
from stalwart.events import AttemptStarted, JobEnded

from .runner import EXAMPLE, events

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("etcd") is None or shutil.which("openssl") is None,
        reason="needs etcd (Debian: etcd-server) and openssl",
    ),
]


def _job_key(tmp_path: Path) -> Path:
    """A job key for multi-node runs (stalwart/job_key.py), private to this user."""
    path = tmp_path / "job.key"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def _agent(run_dir: Path, node: int, endpoint: str, certs: Certs, env: dict[str, str]) -> subprocess.Popen:
    argv = [sys.executable, "-m", "stalwart.cli", "run", "-q", "--nnodes", "2", "--nproc-per-node", "1"]
    argv += ["--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id", "etcd-tls-e2e"]
    argv += ["--etcd-cacert", str(certs.ca), "--etcd-cert", str(certs.client_cert)]
    argv += ["--etcd-key", str(certs.client_key)]
    # a loopback address per node keeps n0 group rank 0 (torch orders nodes by address, then pid)
    argv += ["--run-dir", str(run_dir), "--node-name", f"n{node}", "--local-addr", f"127.0.0.{node + 1}"]
    argv += [*EXAMPLE, "--steps", "6", "--checkpoint-every", "3"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_two_agents_train_to_success_through_an_etcd_with_client_certificates(tmp_path):
    certs = make_certs(tmp_path / "certs")
    env = {**os.environ, "STALWART_JOB_KEY_FILE": str(_job_key(tmp_path))}
    agents: list[subprocess.Popen] = []
    with etcd_member(tmp_path / "etcd", certs) as endpoint:
        try:
            agents = [_agent(tmp_path / "run", n, endpoint, certs, env) for n in (0, 1)]
            outs = [a.communicate(timeout=400)[0] for a in agents]
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
                    a.wait(timeout=30)
    assert [a.returncode for a in agents] == [0, 0], outs
    starts = events(tmp_path / "run", AttemptStarted)
    assert {(s.node, s.world_size, s.num_nodes) for s in starts} == {("n0", 2, 2), ("n1", 2, 2)}
    ends = events(tmp_path / "run", JobEnded)
    assert {e.node for e in ends if e.outcome == "succeeded"} == {"n0", "n1"}
