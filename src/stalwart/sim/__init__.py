"""Monte Carlo cluster simulator and planner: checkpoint intervals, spares, restart strategy, scale."""

from .config import CheckpointTier, FailureClass, SimConfig, llama3_failure_mix
from .engine import SimResult, simulate

__all__ = ["CheckpointTier", "FailureClass", "SimConfig", "SimResult", "llama3_failure_mix", "simulate"]
