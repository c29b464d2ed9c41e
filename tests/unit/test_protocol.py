"""The agent-worker contract: every message survives its wire form, the worker environment has
its own prefix, and a run started inside a worker reads none of its parent's settings."""

from __future__ import annotations

import os

import pytest

from stalwart import protocol
from stalwart.protocol import WorkerEnv
from stalwart.settings.run_config import CONFIG_SETTINGS, from_env

MESSAGES = [
    protocol.Hello(3, 1.5),
    protocol.LoopStarted(0, 40, 100, 2.0),
    protocol.LoopStarted(1, 0, 100, 2.0, leaves_state=True),
    protocol.StepBegan(1, 7, 3.25),
    protocol.SectionBegan(1, 7, "forward", 3.5),
    protocol.StepDone(2, 7, 3.0, 0.5, {"forward": 0.25, "backward": 0.125}),
    protocol.CheckpointDone(0, 50, 9.0),
    protocol.CheckpointDone(1, 50, 9.5, False, "local: disk full", protocol.DurableKind.EMERGENCY),
    protocol.PhaseChanged(0, "eval", 120.0, 10.0),
    protocol.Finished(1, 100, True, 11.0),
    protocol.SignalSeen(0, 15, 12.0),
    protocol.Note(0, "checkpoint step-40 rejected: checksum", 13.0),
    protocol.CorruptionFound(2, 41, "odd_one_out", (1,), ("n1",), 0.9, 14.0, ("model.weight",)),
    protocol.CorruptionFound(0, 41, "pair", (), (), 0.5, 14.0),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_as_one_short_line(msg):
    line = protocol.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and len(line) <= protocol.MAX_LINE
    assert protocol.decode(line[:-1]) == msg


def test_a_corruption_finding_too_long_for_one_line_drops_its_tensor_names_not_its_verdict():
    msg = protocol.CorruptionFound(0, 41, "odd_one_out", (1,), ("n1",), 0.9, 14.0, ("w" * 3000, "v" * 3000))
    line = protocol.encode(msg)
    assert len(line) <= protocol.MAX_LINE
    back = protocol.decode(line[:-1])
    assert isinstance(back, protocol.CorruptionFound) and back.tensors == ()
    assert (back.suspect_ranks, back.suspect_nodes, back.verdict) == ((1,), ("n1",), "odd_one_out")


def test_garbled_and_unknown_lines_decode_to_none():
    for line in (
        b"",
        b"not json",
        b'{"k":"step"}',
        b'{"k":"mystery","r":0,"t":1}',
        b"D 1 x",
        b"[1,2]",
        b'{"k":"ckpt","r":0,"t":1,"s":2,"kind":"sometime"}',
        b'{"k":"sdc","r":0,"t":1,"s":2,"v":"pair","sr":["x"],"sn":[],"c":0.5}',
        b'{"k":"sdc","r":0,"t":1,"s":2,"v":"pair","sr":5,"sn":[],"c":0.5}',
    ):
        assert protocol.decode(line) is None


def test_worker_env_round_trips_under_its_own_prefix():
    wenv = WorkerEnv(
        run_dir="/runs/a",
        run_id="a",
        node="n1",
        attempt=2,
        ipc_fd=9,
        control="/runs/a/c.bin",
        agent_pid=123,
        pg_timeout_s=42.5,
        chaos='{"faults": []}',
        leave_state=False,
    )
    env = wenv.to_env()
    assert all(k.startswith(protocol.PREFIX) for k in env)
    assert WorkerEnv.from_env(env) == wenv
    assert WorkerEnv.from_env({**env, f"{protocol.PREFIX}LEAVE_STATE": "1"}).leave_state  # the default: on
    assert WorkerEnv.from_env({}) is None  # plain python / torchrun: no agent


def test_a_run_started_inside_a_worker_inherits_none_of_its_parents_settings():
    parent = {
        "STALWART_RUN_DIR": "/runs/parent",
        "STALWART_CHAOS": "crash@rank=0,step=3",
        "STALWART_MAX_RESTARTS": "9",
        "STALWART_SHM_DIR": "/dev/shm/x",
        "PATH": "/bin",
    }
    worker = {
        **WorkerEnv.strip(parent, set(CONFIG_SETTINGS)),
        **WorkerEnv(run_dir="/runs/parent", run_id="p", node="n", attempt=0).to_env(),
    }
    assert from_env(worker) == {}  # the nested `stalwart run` configures itself from scratch
    assert worker["PATH"] == "/bin" and worker["STALWART_SHM_DIR"] == "/dev/shm/x"  # not settings: kept


def test_the_sdk_and_the_agent_share_one_process_group_timeout_default():
    from stalwart.settings.run_config import RunConfig
    from stalwart.train.session import Session

    assert RunConfig(script="x.py").hang.pg_timeout_s == protocol.DEFAULT_PG_TIMEOUT_S
    with Session(env={}) as session:
        assert session.pg_timeout_s == protocol.DEFAULT_PG_TIMEOUT_S


def test_the_agent_gives_workers_torchruns_env_and_none_of_its_settings(tmp_path, monkeypatch):
    from stalwart.launch.agent import Agent
    from stalwart.protocol.pipe import Receiver
    from stalwart.settings.run_config import build

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    monkeypatch.setenv("STALWART_RUN_DIR", str(tmp_path / "outer"))  # the parent run's settings
    monkeypatch.setenv("STALWART_CHAOS", "crash@rank=0,step=3")
    cfg = build(
        {
            "script": str(script),
            "nproc_per_node": 2,
            "run_dir": tmp_path / "run",
            "node_name": "n0",
            "role": "trainer",
        },
        env={},
    )
    agent = Agent(cfg)
    rx = Receiver()
    try:
        specs = agent._worker_specs(0, 1, "127.0.0.1", 29555, rx, tmp_path / "ctl.bin")
        for spec in specs:
            os.close(spec.ipc_fd)
    finally:
        rx.close()
        agent.ledger.close()
    env = specs[1].env
    assert from_env(env) == {}  # a nested `stalwart run` would start from its own settings
    assert {"STALWART_RUN_DIR", "STALWART_CHAOS"}.isdisjoint(env)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == (
        "1",
        "1",
        "2",
        "1",
    )
    assert env["ROLE_NAME"] == "trainer" and env["MASTER_PORT"] == "29555"
    assert env["TORCHELASTIC_ERROR_FILE"].endswith("n0-a0-r1.elastic.json")
    wenv = WorkerEnv.from_env(env)
    assert wenv is not None and wenv.run_dir == str(tmp_path / "run") and wenv.ipc_fd == specs[1].ipc_fd


def test_a_workers_place_is_read_back_from_the_variables_the_agent_writes():
    env = protocol.elastic_env(
        rank=5,
        local_rank=1,
        world=8,
        local_world=4,
        group_rank=1,
        group_world=2,
        role="default",
        master_addr="10.0.0.1",
        master_port=29500,
        restart_count=2,
        max_restarts=3,
        run_id="r",
        error_file="/e",
    )
    place = protocol.WorkerPlace.from_env(env)
    assert place == protocol.WorkerPlace(
        rank=5, world_size=8, local_rank=1, local_world_size=4, group_rank=1, attempt=2, has_master=True
    )
    # Stalwart's own attempt counter wins over torch elastic's restart count
    wenv = WorkerEnv(run_dir="/r", run_id="r", node="n", attempt=7).to_env()
    assert protocol.WorkerPlace.from_env({**env, **wenv}).attempt == 7
    # a plain `python train.py`: rank 0 of 1, no rendezvous; empty values count as unset
    assert protocol.WorkerPlace.from_env({"RANK": ""}) == protocol.WorkerPlace()
    assert protocol.WorkerPlace.from_env({"WORLD_SIZE": "3"}).local_world_size == 3


def test_the_node_memory_layout_is_the_one_the_checkpoint_tier_uses(tmp_path):
    from stalwart.checkpoint.node_tier import HELD, OWN
    from stalwart.protocol.run_dir import MemDir

    mem = MemDir(tmp_path)
    assert (mem.own, mem.held) == (tmp_path / OWN, tmp_path / HELD)
    secret = bytes(range(32))
    assert WorkerEnv(run_dir="", run_id="", node="n", attempt=0, peer_secret=secret.hex()).peer_key == secret
    assert WorkerEnv(run_dir="", run_id="", node="n", attempt=0).peer_key == b""
