"""Membership edges: the first round's start-up window, and the mark a finished job leaves."""

from __future__ import annotations

import pytest

from stalwart.errors import ConfigError
from stalwart.launch.clock import ManualClock
from stalwart.launch.rendezvous.arrival import (
    FinishedMark,
    await_hosts,
    mark_finished,
    read_finished,
    wait_for_hosts,
)
from stalwart.policy.timeouts import HangTimeoutPolicy, validate_hierarchy
from stalwart.settings.run_config import RunConfig, parse_rdzv_conf


class DictStore:
    """The few torch Store calls the window and the mark use, over a dict."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def add(self, key: str, n: int) -> int:
        v = int(self.kv.get(key, b"0")) + n
        self.kv[key] = str(v).encode()
        return v

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.kv for k in keys)

    def get(self, key: str) -> bytes:
        return self.kv[key]


def test_the_window_ends_when_the_last_host_arrives():
    clock = ManualClock()
    arrivals = iter([1, 1, 1, 2])  # the second host counts itself in on the fourth look
    got = wait_for_hosts(lambda: next(arrivals), 2, 30.0, clock)
    assert got.complete and got.here == 2
    assert got.waited_s == pytest.approx(0.6)  # three polls, not the window


def test_the_window_is_bounded_when_a_host_never_comes():
    clock = ManualClock()
    got = wait_for_hosts(lambda: 1, 3, 5.0, clock)
    assert not got.complete and got.here == 1 and got.waited_s == pytest.approx(5.0)
    assert sum(clock.slept) == pytest.approx(5.0)


def test_every_agent_counts_itself_in_once():
    store, clock = DictStore(), ManualClock()
    await_hosts(store, "job", 2, 0.0, clock)  # the first host: window over at once (0 s)
    got = await_hosts(store, "job", 2, 30.0, clock)  # the second finds both counted
    assert got.complete and got.waited_s == 0.0
    other = await_hosts(store, "other-job", 2, 1.0, clock)  # run ids do not mix
    assert other.here == 1


def test_the_finished_mark_round_trips_and_anything_else_is_no_mark():
    store = DictStore()
    assert read_finished(store, "job") is None
    mark_finished(store, "job", FinishedMark(199, 1_800_000_000.0))
    got = read_finished(store, "job")
    assert got == FinishedMark(199, 1_800_000_000.0)
    text = got.message("job")
    assert "already succeeded at step 199" in text and "2027-01-15" in text and "nothing launched" in text
    store.kv["stalwart/finished/job"] = b"\x80\x04junk"
    assert read_finished(store, "job") is None


def test_the_window_is_a_setting_in_the_timeout_order(tmp_path):
    assert parse_rdzv_conf("startup_window=12") == {"rdzv_startup_window_s": "12"}
    cfg = RunConfig(script="t.py", run_dir=tmp_path, run_id="r", rdzv_endpoint="h0:29400", nnodes="1:2")
    assert cfg.rendezvous.startup_window_s == 30.0
    with pytest.raises(ConfigError, match="start-up window .* must be shorter than rendezvous timeout"):
        validate_hierarchy(
            monitor_interval_s=0.5,
            policy=HangTimeoutPolicy(),
            pg_timeout_s=600,
            rdzv_timeout_s=900,
            stop_grace_s=5,
            startup_window_s=900,
        )
    with pytest.raises(Exception, match="--rdzv-startup-window"):
        RunConfig(
            script="t.py",
            run_dir=tmp_path,
            run_id="r",
            rdzv_endpoint="h0:29400",
            nnodes="1:2",
            rdzv_startup_window_s=1000,
            rdzv_timeout_s=950,
            pg_timeout_s=900,
        )
    # a job whose minimum is its maximum never waits in the window: no order to keep
    RunConfig(
        script="t.py",
        run_dir=tmp_path,
        run_id="r",
        rdzv_endpoint="h0:29400",
        nnodes="2",
        rdzv_startup_window_s=1000,
        rdzv_timeout_s=950,
        pg_timeout_s=900,
    )
