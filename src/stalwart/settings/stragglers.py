"""Settings of straggler -> action (part of the one schema: settings/schema.py has the rest,
settings/run_config.py composes them into ``RunConfig``): the mode, the precision gate, the costs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from ..diagnose.straggler_action import STRAGGLER_MODES, StragglerActionConfig
from .schema import MODEL_CONFIG, setting

_STRAGGLER_POLICY = StragglerActionConfig.model_fields  # its defaults are the run's


class StragglerSettings(BaseModel):
    """Straggler -> action (diagnose/straggler_action.py): the mode, the precision gate, the costs."""

    model_config = MODEL_CONFIG

    action: Annotated[str, setting("straggler_action", "--straggler-action")] = Field(
        default="observe",
        description="observe: record the straggler policy's verdicts; auto: act once the detector's "
        "measured precision passes; act: exclude a costly straggler's node unless measured precision fails.",
    )
    act_min_precision: Annotated[
        float, setting("straggler_act_min_precision", "--straggler-min-precision")
    ] = Field(default=0.9, ge=0, le=1, description="Precision the straggler detector needs to act.")
    act_min_firings: Annotated[int, setting("straggler_act_min_firings")] = Field(
        default=5, ge=1, description="Firings the detector's measured precision needs before it counts."
    )
    history: Annotated[Path | None, setting("straggler_history", "--straggler-history")] = Field(
        default=None, description="Run dir or ledger whose straggler firings add to the measured precision."
    )
    recovery_s: Annotated[float, setting("straggler_recovery_s", "--straggler-recovery")] = Field(
        default=_STRAGGLER_POLICY["recovery_s"].default,
        ge=0,
        description="Seconds a restart without the straggler's node costs, restart to first step.",
    )
    margin: Annotated[float, setting("straggler_margin")] = Field(
        default=_STRAGGLER_POLICY["margin"].default,
        ge=1,
        description="Continuing must cost this many times more than excluding the node.",
    )
    min_confidence: Annotated[float, setting("straggler_min_confidence")] = Field(
        default=_STRAGGLER_POLICY["min_confidence"].default,
        ge=0,
        le=1,
        description="Act only on straggler detections at least this sure.",
    )

    @field_validator("action")
    @classmethod
    def _action(cls, v: str) -> str:
        if v not in STRAGGLER_MODES:
            raise ValueError(f"--straggler-action {v!r} must be {', '.join(STRAGGLER_MODES)}")
        return v

    @property
    def policy(self) -> StragglerActionConfig:
        """The straggler-action policy's settings (diagnose/straggler_action.py)."""
        return StragglerActionConfig.model_validate(
            {"min_confidence": self.min_confidence, "margin": self.margin, "recovery_s": self.recovery_s}
        )
