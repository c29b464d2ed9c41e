"""Another local user (uid 65534 through setpriv) against a running two-node root job on loopback
(``--nnodes 2:3``, DDP under ``Session.run``, the default job key): the reproductions of the third
security review. The attacker reaches the c10d rendezvous store and the workers' store and, in turn,
announces a shrink to one node, offers a fake node and says it is ready (under the board's old keys,
and as a well-formed board document without the job's seal under its key), and replaces the pickled
rendezvous state with one that runs ``touch MARKER``. Before the job key, the pickle ran as root and the
fake announcement made n0 train alone; here nothing of it is taken: no marker, no shrink, no
admission, both nodes train at world size 2 to the end, and the agents say they ignored unsigned
records."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.events import ReformedInPlace, StepCompleted

from .runner import console, events, events_so_far, wait_listening
from .test_grow_in_place import SCRIPT, _agent, _until

pytestmark = pytest.mark.e2e
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
ATTACK = str(Path(__file__).parent / "scripts" / "control_plane_attack.py")
RUN_ID = "trust-in-place"  # this file's own run id (test_grow_in_place.py's jobs may run meanwhile)


@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another user needs root")
def test_another_user_cannot_run_code_shrink_or_join_a_running_group(tmp_path: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="stalwart-attack-"))  # the attacker's own, world-writable
    shared.chmod(0o777)
    marker = shared / "ran-as-root"
    port, run = free_port(), tmp_path / "run"
    procs: dict[str, subprocess.Popen] = {}
    try:
        extra = ("--rdzv-conf", "last_call_timeout=1", "--rdzv-startup-window", "0")
        for i in range(2):
            procs[f"n{i}"] = _agent(
                tmp_path, port, i, [SCRIPT, "100000", str(tmp_path)], 1, *extra, quiet=False, run_id=RUN_ID
            )
            if i == 0:
                wait_listening(port, procs["n0"])
        _until("training", lambda: events_so_far(run, StepCompleted), procs)
        attack = subprocess.run(
            [*NOBODY, sys.executable, ATTACK, str(port), RUN_ID, str(marker)],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": os.environ["PATH"], "HOME": str(shared)},
        )
        assert attack.returncode == 0, attack.stdout + attack.stderr
        assert "planted the rendezvous state pickle" in attack.stdout
        latest = max(e.step for e in events(run, StepCompleted))
        part = tmp_path / "stop-at.tmp"
        part.write_text(str(latest + 20))  # some more steps after the attack, then every rank stops
        part.rename(tmp_path / "stop-at")
        outs = {n: p.communicate(timeout=300)[0] for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        ran = marker.exists()
        shutil.rmtree(shared, ignore_errors=True)
    assert not ran, "the planted rendezvous state was unpickled: code ran as the job's user"
    assert {n: p.returncode for n, p in procs.items()} == {"n0": 0, "n1": 0}, outs
    assert not [e for e in events(run, ReformedInPlace) if e.shrunk_from or e.grown_from]
    for rank in (0, 1):  # one call of train per rank, always at world size 2: no shrink, no re-formation
        places = (tmp_path / f"place-rank{rank}.txt").read_text().split("\n")
        assert [ln.split()[1:] for ln in places if ln] == [[str(rank), "2"]], places
    said = console("\n".join(outs.values()))
    assert "ignored an unsigned board state in the worker store" in said, said
    assert "ignored a rendezvous state not signed with this job's key" in said, said


PLANT_IN_ETCD = """
import base64, json, os, pickle, sys, urllib.request
endpoint, run_id, marker = sys.argv[1:4]
class Touch:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))
def put(key, value):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(), "value": base64.b64encode(value).decode()})
    urllib.request.urlopen(urllib.request.Request(f"http://{endpoint}/v3/kv/put", body.encode()), timeout=10).read()
put(f"/stalwart/marks/{run_id}/stalwart/finished/{run_id}", json.dumps({"step": 123456, "ended_at": 1.0}).encode())
put(f"/stalwart/rdzv/{run_id}/state", pickle.dumps(Touch()))
print("planted")
"""


@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("etcd") is None, reason="needs root and etcd")
def test_a_mark_and_a_pickled_state_planted_in_etcd_by_another_user_are_not_taken(tmp_path: Path) -> None:
    """A plain ``/v3/kv/put`` as uid 65534 before the job starts: a finished mark (before the job key:
    "already succeeded at step 123456 ... nothing launched", exit 0) and a pickled rendezvous state
    that runs ``touch MARKER`` (before: run as root by every agent). Both are refused: the job trains."""
    from etcdutil import etcd_member

    from .runner import EXAMPLE

    shared = Path(tempfile.mkdtemp(prefix="stalwart-attack-"))
    shared.chmod(0o777)
    marker, run, run_id = shared / "ran-as-root", tmp_path / "run", "etcd-planted"
    agents: list[subprocess.Popen] = []
    try:
        with etcd_member(tmp_path / "etcd", name="planted") as endpoint:
            plant = subprocess.run(
                [*NOBODY, sys.executable, "-c", PLANT_IN_ETCD, endpoint, run_id, str(marker)],
                capture_output=True,
                text=True,
                timeout=60,
                env={"PATH": os.environ["PATH"], "HOME": str(shared)},
            )
            assert plant.stdout.strip() == "planted", plant.stderr
            for node in (0, 1):
                argv = [
                    sys.executable,
                    "-m",
                    "stalwart.cli",
                    "run",
                    "--nnodes",
                    "2",
                    "--rdzv-backend",
                    "etcd",
                ]
                argv += ["--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--run-dir", str(run)]
                argv += ["--node-name", f"n{node}", "--local-addr", f"127.0.0.{node + 1}"]
                argv += [*EXAMPLE, "--steps", "6", "--checkpoint-every", "3"]
                agents.append(
                    subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                )
            outs = [a.communicate(timeout=400)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait(timeout=30)
        ran = marker.exists()
        shutil.rmtree(shared, ignore_errors=True)
    assert not ran, "the planted rendezvous state was unpickled: code ran as the job's user"
    assert [a.returncode for a in agents] == [0, 0], outs
    said = console("\n".join(outs))
    assert "already succeeded" not in said and "ignored a rendezvous state not signed" in said, said
    assert {e.node for e in events(run, StepCompleted)} == {"n0", "n1"}
