"""What ranks exchange on the checkpoint and recovery paths is JSON, checked on receipt
(protocol/json_collective.py and the records that cross it): no processes, no process group."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from stalwart.checkpoint.collective import Collective
from stalwart.checkpoint.manifest import FileEntry, Manifest
from stalwart.checkpoint.node_tier import Assembled, RestoreSource
from stalwart.checkpoint.persist import _manifest_from_json, _written_from_json
from stalwart.checkpoint.tier_walk import candidates_from_json, candidates_to_json
from stalwart.protocol.json_collective import (
    MAX_BYTES,
    PeerDataError,
    check_length,
    decode,
    device_for,
    encode,
)
from stalwart.train import rng


class _Boom:
    def __reduce__(self):
        return (print, ("unpickled",))


def test_a_value_survives_encode_and_decode():
    value = {"a": [1, -2.5, None, True, "é"], "b": {"c": []}}
    assert decode(encode(value), 3) == value


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), {1: "x"}.items(), {(1, 2): 3}, object(), b"bytes"]
)
def test_a_value_that_is_not_json_is_not_encoded(bad):
    with pytest.raises(ValueError, match="not a JSON value"):
        encode(bad)


def test_a_value_over_the_limit_is_not_encoded():
    with pytest.raises(ValueError, match="over the 10-byte limit"):
        encode("x" * 20, limit=10)


@pytest.mark.parametrize(
    "data", [pickle.dumps(_Boom()), b"\xff\xfe", b"", b"{", b"NaN", b"[Infinity]", b"1 2"]
)
def test_bytes_that_are_not_json_are_refused_naming_the_rank(data, capsys):
    with pytest.raises(PeerDataError, match="rank 2 sent .* not JSON"):
        decode(data, 2)
    assert "unpickled" not in capsys.readouterr().out


def test_a_length_outside_the_cap_is_refused():
    assert check_length(0, 1) == 0 and check_length(MAX_BYTES, 1) == MAX_BYTES
    with pytest.raises(PeerDataError, match="rank 1 announced a payload of 65 bytes, outside 0..64"):
        check_length(65, 1, limit=64)
    with pytest.raises(PeerDataError, match="rank 1 announced"):
        check_length(-7, 1)
    with pytest.raises(PeerDataError, match="rank 4 could not encode its value"):
        check_length(-1, 4)


def test_gloo_and_mixed_groups_use_host_memory():
    assert device_for("gloo") == "cpu"
    assert device_for("cpu:gloo,cuda:nccl") == "cpu"
    assert device_for("mpi") == "cpu"


def test_a_single_rank_collective_hands_back_json_and_typed_values():
    comm = Collective.create(1)
    assert comm.all_gather([1, "a"]) == [[1, "a"]]
    assert comm.broadcast({"k": 1.5}) == {"k": 1.5}
    assert comm.all_gather_str("why") == ["why"]
    assert comm.all_gather_bool(True) == [True]
    assert comm.broadcast_str("") == ""
    assert comm.broadcast_outcome(False, "disk full") == (False, "disk full")
    with pytest.raises(ValueError, match="not a JSON value"):
        comm.all_gather(object())  # type: ignore[arg-type]


def test_a_peer_value_of_the_wrong_type_is_refused():
    from stalwart.checkpoint.collective import _typed

    with pytest.raises(PeerDataError, match="rank 1 sent a int where a str belongs"):
        _typed(5, str, 1)
    with pytest.raises(PeerDataError, match="rank 0 sent a bool where a int belongs"):
        _typed(True, int, 0)


def test_candidates_round_trip_and_a_malformed_one_is_refused():
    cands = [(12, "memory", "/m/step-12"), (10, "disk", "/d/step-10")]
    assert candidates_from_json(decode(encode(candidates_to_json(cands)), 0), 0) == cands
    for bad in ({"a": 1}, [[1, "x"]], [["1", "x", "y"]], [[True, "x", "y"]], [[1, "x", 2]]):
        with pytest.raises(PeerDataError, match="rank 3 sent"):
            candidates_from_json(bad, 3)


def test_a_node_restore_result_round_trips_and_a_malformed_one_is_refused():
    for res in (
        Assembled("/m/step-3", RestoreSource.PEER, "", ("a from n1",), 0.25),
        Assembled("", None, "no manifest"),
    ):
        assert Assembled.from_json(decode(encode(res.to_json()), 0), 0) == res
    good = Assembled("/p", RestoreSource.MEMORY).to_json()
    assert isinstance(good, dict)
    for bad in (None, [], {**good, "source": "disk"}, {**good, "fetched": [1]}, {**good, "x": 1}):
        with pytest.raises(PeerDataError, match="rank 2 sent a malformed node restore result"):
            Assembled.from_json(bad, 2)


def test_written_files_and_the_manifest_round_trip_and_malformed_ones_are_refused():
    entry = FileEntry(size=10, sha256="a" * 64)
    sent = ["", {"rank-0.pt": entry.model_dump(mode="json", exclude_none=True)}]
    assert _written_from_json(decode(encode(sent), 0), 0) == ("", {"rank-0.pt": entry})
    for bad in (["", {"f": {"size": -1, "sha256": "a" * 64}}], ["", []], "x", ["", {"f": {"size": 1}}]):
        with pytest.raises(PeerDataError, match="rank 1 sent a malformed list of written files"):
            _written_from_json(bad, 1)
    man = Manifest(step=3, world_size=2, files={"rank-0.pt": entry}, created=1.5, meta={"emergency": False})
    assert _manifest_from_json(decode(encode(man.to_json()), 0)) == man
    assert _manifest_from_json(["rank 0: manifest: too big"]) == "rank 0: manifest: too big"
    with pytest.raises(PeerDataError, match="does not parse"):
        _manifest_from_json('{"step": -1}')
    with pytest.raises(PeerDataError, match="where a manifest belongs"):
        _manifest_from_json(3)


def _draws() -> tuple:
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


def test_an_rng_state_survives_json_exactly():
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    random.gauss(0, 1)  # a cached Gaussian in Python's state
    np.random.randn()  # and in numpy's
    cap = rng.capture()
    want = _draws()
    back = rng.from_json(decode(encode(rng.to_json(cap)), 0))
    assert back.keys() == cap.keys()
    assert back["python"] == cap["python"]
    assert torch.equal(back["torch"], cap["torch"]) and back["torch"].dtype == torch.uint8
    assert back["numpy"][0] == cap["numpy"][0] and torch.equal(back["numpy"][1], cap["numpy"][1])
    assert back["numpy"][2:] == cap["numpy"][2:]
    _draws()
    rng.restore(back)
    assert _draws() == want


def test_a_malformed_rng_state_is_refused():
    good = rng.to_json(rng.capture())
    assert isinstance(good, dict)
    for bad in (
        None,
        {},
        {**good, "torch": "**"},
        {**good, "python": [3, ["x"], None]},
        {**good, "numpy": [1]},
    ):
        with pytest.raises(ValueError):
            rng.from_json(bad)
