"""Settings of the recovery ladder's first rung and of silent-data-corruption checks (part of the one
schema: settings/schema.py has the rest, settings/run_config.py composes them into ``RunConfig``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from ..protocol import DEFAULT_REFORM_TIMEOUT_S, DEFAULT_SDC_BUDGET
from .schema import MODEL_CONFIG, setting


class InPlaceSettings(BaseModel):
    """In-place recovery (docs/fast-recovery.md): survivors keep their processes, only failed ranks
    are replaced, state comes from a live replica."""

    model_config = MODEL_CONFIG

    enabled: Annotated[bool, setting("in_place", "--in-place/--no-in-place")] = Field(
        default=True,
        description="Re-form the process group in place when a rank fails (scripts under Session.run).",
    )
    timeout_s: Annotated[float, setting("in_place_timeout_s", "--in-place-timeout")] = Field(
        default=DEFAULT_REFORM_TIMEOUT_S,
        gt=0,
        description="Seconds each step of an in-place re-formation may take before the whole group restarts.",
    )
    announce_s: Annotated[float, setting("in_place_announce_timeout_s", "--in-place-announce-timeout")] = (
        Field(
            default=5.0,
            gt=0,
            description=(
                "Seconds a node whose ranks lost a peer on another node waits for that node's agent to "
                "announce an in-place re-formation before the whole group restarts; also how long a node "
                "arriving while a group that shrank in place trains waits to be taken back in before it "
                "joins the rendezvous (multi-node)."
            ),
        )
    )
    max_per_attempt: Annotated[int, setting("in_place_max", "--in-place-max")] = Field(
        default=10,
        ge=0,
        description="In-place recoveries within one attempt before the whole group restarts.",
    )
    leave_state: Annotated[bool, setting("leave_state", "--leave-state/--no-leave-state")] = Field(
        default=True,
        description=(
            "When the whole group restarts after a peer's failure (a session.loop script outside "
            "Session.run, or --no-in-place), the survivors leave their live state in node memory and "
            "the restart takes it instead of rolling back to a checkpoint."
        ),
    )
    fail_attempt: Annotated[int, setting("in_place_fail_attempt")] = Field(
        default=-1,
        ge=-1,
        description="The attempt whose in-place recovery is forced to fail (testing); -1: none.",
    )


class SdcSettings(BaseModel):
    """Silent data corruption (docs/sdc.md): data-parallel replicas compare exact fingerprints of their
    state; a replica that differs is named and every rank rolls back to a checkpoint verified clean."""

    model_config = MODEL_CONFIG

    every: Annotated[int, setting("sdc_every", "--sdc-every")] = Field(
        default=0,
        ge=-1,
        description=(
            "Steps between cross-replica state checks (every checkpoint save is checked too); "
            "0: as often as --sdc-budget allows; -1: off."
        ),
    )
    budget: Annotated[float, setting("sdc_budget", "--sdc-budget")] = Field(
        default=DEFAULT_SDC_BUDGET,
        gt=0,
        le=0.5,
        description="Share of step time the cross-replica state checks may take (with --sdc-every 0).",
    )
