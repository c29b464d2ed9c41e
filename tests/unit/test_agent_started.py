"""What the agent started for a job is stopped once, in order, each stop even when an earlier raised."""

from __future__ import annotations

import pytest

from stalwart.launch.agent import _Started


class Part:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    def _done(self, what: str) -> None:
        self.log.append(f"{self.name}.{what}")
        if self.fail:
            raise OSError(f"{self.name} failed")

    def stop(self) -> None:
        self._done("stop")

    def close(self, **kw) -> None:
        self._done("close" + (f"(leaving={kw['leaving']})" if kw else ""))


def test_every_part_stops_once_in_order_even_after_one_raised():
    log: list[str] = []
    held = _Started(
        diagnosis=Part("diagnosis", log),  # type: ignore[arg-type]
        memory=Part("memory", log, fail=True),  # type: ignore[arg-type]
        warm=Part("warm", log),  # type: ignore[arg-type]
        rendezvous=Part("rendezvous", log),  # type: ignore[arg-type]
    )
    with pytest.raises(OSError, match="memory failed"):
        held.close(leaving=True)
    assert log == ["diagnosis.stop", "rendezvous.close(leaving=True)", "memory.close", "warm.close"]
    held.close(leaving=False)  # on the way out again: nothing is stopped twice
    assert len(log) == 4
