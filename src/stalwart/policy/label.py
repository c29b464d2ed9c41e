"""The base of the project's statuses and kinds: a ``str`` enum that prints as its value.

A member equals its value (``FailureKind.CRASH == "crash"``), so code that still compares with strings,
and events that carry the value into the ledger, keep working; ``str()`` and f-strings give the value
on every supported Python (3.12 changed how a ``str`` mix-in enum formats)."""

from __future__ import annotations

from enum import Enum


class Label(str, Enum):
    def __str__(self) -> str:
        return str(self.value)
