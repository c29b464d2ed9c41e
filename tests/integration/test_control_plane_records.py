"""Records in the c10d rendezvous store rewritten by another local user (uid 65534 through setpriv):
the running group's worker-store record sent a returning node to a fake board that fed it the
attacker's weights. A record that is not signed with the job key is refused: the node joins the
rendezvous instead, and says why once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from netutil import free_port
from stalwart.job_key import JobKey, KeySource
from stalwart.launch.rendezvous.arrival import mark_workers
from stalwart.launch.rendezvous.node_rendezvous import NodeRendezvous
from stalwart.launch.rendezvous.sealed import c10d_store

pytestmark = pytest.mark.integration
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
REWRITE = """
import sys
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=timedelta(seconds=10))
store.set("stalwart/workers/job", '{"addr": "127.0.0.1", "port": 4444}')
print("rewritten")
"""


def _until(check, timeout_s: float = 120.0):
    """``check()`` once it is truthy; each call is itself bounded (the store's probe deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.1)  # a poll: nothing tells a store client when the store answers again
    raise AssertionError("not within the deadline")


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another user needs root")
def test_a_worker_store_record_rewritten_by_another_user_is_refused():
    port = free_port()
    host = c10d_store(f"127.0.0.1:{port}", True, 10.0)
    cfg = SimpleNamespace(
        use_c10d=True,
        max_nodes=3,
        run_id="job",
        reform=SimpleNamespace(enabled=True),
        rendezvous=SimpleNamespace(
            backend="c10d", endpoint=f"127.0.0.1:{port}", id="job", store_timeout_s=10.0
        ),
    )
    notes: list[str] = []
    first = NodeRendezvous(cfg, key=JobKey(b"k" * 32, KeySource.FILE))
    mark_workers(first.sealed(host), "job", "127.0.0.1", 29511)  # as the first node of a round does
    arriving = NodeRendezvous(cfg, key=JobKey(b"k" * 32, KeySource.FILE), note=notes.append)
    assert _until(arriving.workers_elsewhere) == (
        "127.0.0.1",
        29511,
    )  # bounded reads: may time out under load
    done = subprocess.run(
        [*NOBODY, sys.executable, "-c", REWRITE, str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], "HOME": "/"},
    )
    assert done.stdout.strip() == "rewritten", done.stderr
    answers: list[tuple[str, int] | None] = []
    _until(lambda: answers.append(arriving.workers_elsewhere()) or arriving.refusals.count)
    assert answers[-1] is None  # not the fake board: the rendezvous decides
    assert arriving.refusals.count == 1 and "stalwart/workers/job" in notes[0], notes
    del host
