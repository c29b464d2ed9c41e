"""Which failure a worker's exit is: user exception, comm error (peer lost) or crash."""

from __future__ import annotations

import json

import pytest

from stalwart.diagnose.root_cause import ErrorRecord, classify, read_error


def rec(type_: str, message: str, step: int = 3) -> ErrorRecord:
    return ErrorRecord(type=type_, message=message, step=step, ts=1.0)


def test_signature_is_short_type_and_first_line():
    r = rec("builtins.ValueError", "bad shape (3, 4)\nmore detail\n")
    assert r.signature == "ValueError: bad shape (3, 4)"
    assert rec("builtins.RuntimeError", "").signature == "RuntimeError: "
    assert rec("x.E", "a" * 500).signature == "E: " + "a" * 200


@pytest.mark.parametrize(
    "type_, message",
    [
        ("torch.distributed.DistBackendError", "NCCL error in: ..."),
        (
            "builtins.RuntimeError",
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
        ),
        ("builtins.RuntimeError", "Connection reset by peer"),
        ("torch.distributed.DistNetworkError", "failed to recv, got 0 bytes"),
        ("builtins.RuntimeError", "Timed out waiting 1800000ms for recv operation"),
    ],
)
def test_comm_errors_are_peer_lost(type_, message):
    r = rec(type_, message)
    assert r.is_comm_error
    assert classify(1, r) == "peer_lost"


@pytest.mark.parametrize(
    "type_, message",
    [
        ("builtins.ValueError", "expected input of shape (8, 16), got (8, 17)"),
        ("builtins.ZeroDivisionError", "division by zero"),
        ("builtins.RuntimeError", "injected bug at step 30 (chaos: raise@rank=0,step=30)"),
    ],
)
def test_user_exceptions_are_exceptions(type_, message):
    r = rec(type_, message)
    assert not r.is_comm_error
    assert classify(1, r) == "exception"


@pytest.mark.parametrize(
    "type_, message",
    [
        ("builtins.AttributeError", "'Trainer' object has no attribute 'restore_from'"),
        ("builtins.FileNotFoundError", "[Errno 2] No such file or directory: '/data/datastore/shard-3.bin'"),
        ("builtins.KeyError", "'sender_id'"),
    ],
)
def test_user_exceptions_mentioning_comm_words_are_still_exceptions(type_, message):
    assert classify(1, rec(type_, message)) == "exception"


def test_signal_deaths_and_missing_records_are_crashes():
    assert classify(-9, None) == "crash"
    assert classify(1, None) == "crash"
    # a rank killed by a signal is a crash even if an error record exists
    assert classify(-11, rec("builtins.ValueError", "x")) == "crash"


def test_read_error(tmp_path):
    p = tmp_path / "e.json"
    p.write_text(
        json.dumps(
            {
                "type": "builtins.KeyError",
                "message": "'lr'",
                "step": 12,
                "ts": 5.5,
                "traceback": "Traceback ...",
            }
        )
    )
    r = read_error(p)
    assert r == ErrorRecord("builtins.KeyError", "'lr'", 12, 5.5, "Traceback ...")
    p.write_text(json.dumps({"type": "builtins.KeyError", "message": "m", "step": None}))
    assert read_error(p).step == -1  # an exception outside a step
    assert read_error(tmp_path / "missing.json") is None
    p.write_text("{not json")
    assert read_error(p) is None
    p.write_text(json.dumps({"message": "no type"}))
    assert read_error(p) is None
