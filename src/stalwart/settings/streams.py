"""torchrun's stream settings (``--redirects``, ``--tee``): which of a local rank's streams, by
number, leave the console or go to a file as well (pure parsing, part of the settings)."""

from __future__ import annotations

NONE, OUT, ERR, ALL = 0, 1, 2, 3


def parse_streams(spec: str, nproc: int, *, flag: str = "--redirects") -> list[int]:
    """``3`` (every local rank) or ``0:1,1:2`` (per local rank) -> one value 0..3 per local rank."""
    spec = str(spec).strip()
    if spec.isdigit():
        v = int(spec)
        if v > ALL:
            raise ValueError(f"{flag} {spec!r} must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
        return [v] * nproc
    out = [NONE] * nproc
    for item in spec.split(","):
        rank, sep, value = item.partition(":")
        if not sep or not rank.strip().isdigit() or not value.strip().isdigit() or int(value) > ALL:
            raise ValueError(f"{flag} {spec!r} must be 0..3 or LOCAL_RANK:0..3 pairs, e.g. 0:1,1:2")
        if int(rank) < nproc:
            out[int(rank)] = int(value)
    return out


__all__ = ["ALL", "ERR", "NONE", "OUT", "parse_streams"]
