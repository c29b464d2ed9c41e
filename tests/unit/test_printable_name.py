"""Node names other processes wrote reach the console and the ledger printable: control characters
escaped, length capped; a valid host name is unchanged."""

from __future__ import annotations

import io

from stalwart.events import IncidentRaised, TrainingResumed
from stalwart.launch.console import RunConsole
from stalwart.launch.ledger_sink import NodeLedger
from stalwart.node_name import MAX_LENGTH, printable_name

EVIL = "n1\x1b[2J\x1b]0;owned\x07\r\nfake\u202e\\"


def test_a_host_name_is_unchanged():
    assert printable_name("gpu-017.rack3_a") == "gpu-017.rack3_a"
    assert printable_name("") == ""


def test_control_characters_are_escaped_and_nothing_raw_is_left():
    shown = printable_name(EVIL)
    assert shown == "n1\\x1b[2J\\x1b]0;owned\\x07\\r\\nfake\\u202e\\\\"
    assert shown.isprintable()


def test_a_long_name_is_cut_and_counted():
    shown = printable_name("a" * (MAX_LENGTH + 40) + "\x1b")
    assert shown == "a" * MAX_LENGTH + "...(+41 characters)"
    assert printable_name("\x00" * 10, limit=2) == "\\x00\\x00...(+8 characters)"


def test_the_console_shows_a_planted_name_escaped():
    out = io.StringIO()
    RunConsole(stream=out).note(f"node {EVIL} joined")
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "n1\\x1b[2J" in text and "fake\\u202e" in text


class _Writer:
    def __init__(self) -> None:
        self.events: list = []

    def extend(self, evs) -> None:
        self.events.extend(evs)

    def close(self) -> None:
        pass


def test_the_ledger_records_node_names_printable():
    w = _Writer()
    ledger = NodeLedger(w, run_id="r", node="n0")
    ledger.emit(TrainingResumed(ts=1.0, node=EVIL, step=3), show=False)
    inc = IncidentRaised(
        ts=2.0,
        cause="c",
        fault_class="unknown",
        component="gpu",
        confidence=0.5,
        action="a",
        nodes=("ok", EVIL),
    )
    ledger.emit(inc, show=False)
    ok = TrainingResumed(ts=3.0, node="gpu1", step=4)
    ledger.emit(ok, show=False)
    assert w.events[0].node == printable_name(EVIL) and w.events[0].node.isprintable()
    assert w.events[1].nodes == ("ok", printable_name(EVIL))
    assert w.events[2] is ok
