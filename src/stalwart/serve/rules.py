"""Where the shipped Prometheus alert rules live (package data)."""

from __future__ import annotations

from pathlib import Path


def rules_path() -> Path:
    """The path of ``alerts.yml`` inside the installed package."""
    return Path(__file__).with_name("alerts.yml")
