"""Fault plans injected into real runs (crash, hang, slowdown, kill agent, corrupt checkpoint)."""

from .plan import Fault, FaultKind, FaultPlan, build_plan, parse_spec

__all__ = ["Fault", "FaultKind", "FaultPlan", "build_plan", "parse_spec"]
