"""The job key (where it comes from, what is refused) and its seals over store records and the
rendezvous state: a record planted, replayed, or signed with another key, run or purpose is refused."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import pytest

from memory_backend import Bomb, MemoryBackend
from stalwart.errors import ConfigError
from stalwart.job_key import (
    KEY_ENV,
    KEY_FILE_ENV,
    JobKey,
    KeySource,
    Opened,
    Refusals,
    Refused,
    SealedStore,
    UnsignedRecord,
    make_default_key,
    resolve,
)
from stalwart.launch.rendezvous.sealed import SealedBackend


def _key_file(path: Path, mode: int = 0o600, text: str = "a" * 64) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_key_file_of_ours_0600_is_used_and_one_others_could_read_is_refused(tmp_path):
    good = _key_file(tmp_path / "good")
    assert resolve(key_file=str(good), multi_node=True, env={}).secret == b"a" * 64
    loose = _key_file(tmp_path / "loose", 0o644)
    with pytest.raises(ConfigError, match="mode 0644") as err:
        resolve(key_file=str(loose), multi_node=True, env={})
    assert "chmod 600" in str(err.value.hint)
    short = _key_file(tmp_path / "short", text="x" * 10)
    with pytest.raises(ConfigError, match="10 bytes"):
        resolve(multi_node=True, env={KEY_FILE_ENV: str(short)})
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(ConfigError, match="cannot read"):
        resolve(key_file=str(link), multi_node=True, env={})


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path):
    theirs = _key_file(tmp_path / "theirs")
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        resolve(key_file=str(theirs), multi_node=True, env={})


def test_where_the_key_comes_from_in_order(tmp_path):
    env = {KEY_ENV: "e" * 40, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert resolve(multi_node=True, env=env).source is KeySource.ENV
    with pytest.raises(ConfigError, match="shorter than 32"):
        resolve(multi_node=True, env={KEY_ENV: "short"})
    one = resolve(multi_node=False, env={})
    assert one.source is KeySource.RUN and len(one.secret) == 32
    assert resolve(multi_node=False, env={}).secret != one.secret  # drawn anew for every run
    insecure = resolve(multi_node=True, insecure=True, env={"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert insecure.insecure and not (tmp_path / "none").exists()


def test_several_nodes_make_the_default_key_once_and_then_read_it(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    made = resolve(multi_node=True, env=env)
    path = tmp_path / "cfg" / "stalwart" / "job.key"
    assert made.source is KeySource.MADE_DEFAULT_FILE and made.where == str(path)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    again = resolve(multi_node=True, env=env)
    assert again.source is KeySource.DEFAULT_FILE and again.secret == made.secret


def test_two_nodes_making_the_default_key_at_once_read_the_same_key(tmp_path):
    path = tmp_path / "stalwart" / "job.key"
    made: list[bool] = []
    threads = [threading.Thread(target=lambda: made.append(make_default_key(path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == [False] * 7 + [True]
    assert [p.name for p in path.parent.iterdir()] == ["job.key"]  # no temporary file left


def test_several_nodes_without_any_way_to_a_key_are_refused_with_the_fix(tmp_path):
    blocked = tmp_path / "cfg"
    blocked.write_text("a file where the config directory would be")
    with pytest.raises(ConfigError) as err:
        resolve(multi_node=True, env={"XDG_CONFIG_HOME": str(blocked)})
    assert "openssl rand -hex 32" in str(err.value.hint) and "--insecure-trusted-network" in str(
        err.value.hint
    )


KEY = JobKey(b"k" * 32, KeySource.FILE)


def test_a_seal_binds_key_run_and_purpose():
    signer = KEY.signer("run-1")
    sealed = signer.seal("board/announce|10.0.0.1:29500", b'{"generation": 2}')
    assert signer.open("board/announce|10.0.0.1:29500", sealed) == Opened(b'{"generation": 2}')
    for other, context in (
        (KEY.signer("run-2"), "board/announce|10.0.0.1:29500"),  # another run
        (signer, "board/announce|10.0.0.1:29501"),  # another round's store
        (signer, "board/invite|10.0.0.1:29500"),  # another purpose
        (JobKey(b"o" * 32, KeySource.FILE).signer("run-1"), "board/announce|10.0.0.1:29500"),
    ):
        assert isinstance(other.open(context, sealed), Refused)
    tampered = sealed[:-2] + b"9}"
    assert isinstance(signer.open("board/announce|10.0.0.1:29500", tampered), Refused)
    assert signer.open("x", b'{"generation": 2}') == Refused("not signed")


def test_a_sealed_store_refuses_a_planted_record_and_notes_it_once():
    notes: list[str] = []
    raw: dict[str, bytes] = {}

    class Store:
        def set(self, k, v):
            raw[k] = v if isinstance(v, bytes) else v.encode()

        def get(self, k):
            return raw[k]

        def check(self, keys):
            return all(k in raw for k in keys)

    store = SealedStore(Store(), KEY.signer("r"), Refusals(notes.append))
    store.set("stalwart/master", "10.0.0.1:4000")
    assert store.get("stalwart/master") == b"10.0.0.1:4000"
    raw["stalwart/master"] = b"10.6.6.6:4000"
    for _ in range(2):
        with pytest.raises(UnsignedRecord, match="not signed with this job's key"):
            store.get("stalwart/master")
    assert store.refusals.count == 2 and len(notes) == 1


def test_a_planted_rendezvous_state_is_never_handed_to_torch_and_the_next_write_replaces_it():
    notes: list[str] = []
    inner = MemoryBackend()
    sealed = SealedBackend(inner, KEY.signer("job"), Refusals(notes.append))
    first = pickle.dumps({"round": 1})
    assert sealed.set_state(first, None) == (first, 1, True)
    assert sealed.get_state() == (first, 1)
    inner.value, inner.version = pickle.dumps(Bomb()), 2  # planted by someone without the key
    state, token = sealed.get_state()
    assert state == first and token == 2  # the last authentic state, with the planted bytes' token
    second = pickle.dumps({"round": 2})
    assert sealed.set_state(second, token) == (second, 3, True)  # the compare-and-set replaces them
    assert sealed.get_state() == (second, 3)
    assert sealed.refusals.count == 1 and "not signed with this job's key" in notes[0]


def test_a_replayed_older_rendezvous_state_is_refused():
    inner = MemoryBackend()
    sealed = SealedBackend(inner, KEY.signer("job"), Refusals())
    sealed.set_state(pickle.dumps({"round": 1}), None)
    old = inner.value
    sealed.set_state(pickle.dumps({"round": 2}), 1)
    inner.value, inner.version = old, 5  # a copy of an earlier signed state, written back
    assert sealed.get_state() == (pickle.dumps({"round": 2}), 5) and sealed.refusals.count == 1


def test_planted_bytes_that_hold_the_key_are_replaced_by_the_first_write():
    inner = MemoryBackend()
    sealed = SealedBackend(inner, KEY.signer("job"), Refusals())
    inner.value, inner.version = pickle.dumps(Bomb()), 1  # there before any agent
    assert sealed.get_state() is None  # nothing authentic to hand torch: it starts from an empty state
    mine = pickle.dumps({"round": 1})
    assert sealed.set_state(mine, None) == (mine, 2, True)  # replaced on the planted bytes' token
    assert sealed.get_state() == (mine, 2) and sealed.refusals.count == 2


def test_a_planter_that_keeps_winning_never_gets_its_bytes_to_torch():
    class Racing(MemoryBackend):
        def set_state(self, state, token=None):
            self.value, self.version = b"planted again", self.version + 1
            return self.value, self.version, False

    inner = Racing()
    sealed = SealedBackend(inner, KEY.signer("job"), Refusals())
    assert sealed.set_state(pickle.dumps({"round": 1}), None) is None


def _agent(tmp_path, monkeypatch, notes: list[str], **settings):
    from stalwart.launch.agent import Agent
    from stalwart.settings.run_config import RunConfig

    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    cfg = RunConfig(
        script=str(script),
        run_dir=tmp_path / "run",
        node_name="n0",
        run_id="x",
        nnodes="2",
        rdzv_endpoint="127.0.0.1:29400",
        **settings,
    )
    agent = Agent(cfg, note=notes.append)
    agent.ledger.close()
    return agent


def test_a_multi_node_agent_makes_the_default_key_and_says_where(tmp_path, monkeypatch):
    notes: list[str] = []
    agent = _agent(tmp_path, monkeypatch, notes)
    agent._say_key()
    assert agent.key.source is KeySource.MADE_DEFAULT_FILE
    assert len(notes) == 1 and "made the job key" in notes[0] and "same key" in notes[0]


def test_every_insecure_node_warns(tmp_path, monkeypatch):
    notes: list[str] = []
    agent = _agent(tmp_path, monkeypatch, notes, insecure_trusted_network=True)
    agent._say_key()
    assert agent.key.insecure and notes[0].startswith("WARNING: node n0 runs without a job key")
    assert not (tmp_path / "cfg").exists()  # no key file made for an insecure run
