"""The script's fingerprint: a changed script under the same run id is bad input unless the user
says so (``--continue-changed``); recorded in ``run.json`` when the configuration is built."""

from __future__ import annotations

import hashlib
from pathlib import Path


def fingerprint(script: str, module: bool, no_python: bool) -> str:
    """sha256 of the script file ("" for a module or a program: their code is not one file here)."""
    if module or no_python:
        return ""
    try:
        return hashlib.sha256(Path(script).read_bytes()).hexdigest()
    except OSError:
        return ""


__all__ = ["fingerprint"]
