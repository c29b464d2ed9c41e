"""Numbers for people: durations with a unit that fits them, rates with a few significant digits."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """35 ms, 4.2 s, 12 min, 3.4 h, 2.1 days (never a raw float)."""
    if not math.isfinite(seconds):
        return "never" if seconds > 0 else "-"
    s = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if s < 1.0:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 100.0:
        return f"{sign}{s:.1f} s" if s < 10 else f"{sign}{s:.0f} s"
    if s < 6000.0:
        return f"{sign}{s / 60:.1f} min" if s < 600 else f"{sign}{s / 60:.0f} min"
    if s < 3 * 86400.0:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} days"


def number(x: float) -> str:
    """Three significant digits, thousands separated: 0.0349, 4.21, 1,230, 4.5M."""
    if not math.isfinite(x):
        return "inf" if x > 0 else "-"
    a = abs(x)
    if a >= 1e6:
        return f"{x / 1e6:,.1f}M"
    if a >= 100:
        return f"{x:,.0f}"
    if a == 0:
        return "0"
    return f"{x:.3g}"


def percent(x: float) -> str:
    return f"{100.0 * x:.1f}%"
