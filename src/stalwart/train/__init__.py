"""The in-process training SDK: timings, heartbeats, exact resume, emergency checkpoints."""

from .session import Session

__all__ = ["Session"]
